// Shared by the service's pages (page.html, job.html): inlined into each by the service, so the page's
// content security policy still names its scripts by their hashes.
"use strict";
const STATUSES = ["new", "submitting", "submitted", "running", "completing", "completed", "failed", "killed", "held"];
const $ = (id) => document.getElementById(id);
// The session's CSRF token: given once in the address's fragment by the login (/?token=...), kept in this
// origin's storage (another port cannot read it), and shown with every request the page makes.
const CSRF = (() => {
  const given = /^#csrf=([A-Za-z0-9_-]+)$/.exec(location.hash);
  if (given) {
    localStorage.setItem("orch_csrf", given[1]);
    history.replaceState(null, "", location.pathname + location.search);
  }
  return localStorage.getItem("orch_csrf") || "";
})();
const WITH_CSRF = {"x-csrf-token": CSRF};

// Control characters from a job (its name, a reason) are shown as escapes (ESC as \x1b), never as they are:
// the bidirectional ones would reorder what the page shows around them.
const CONTROLS = /[\u0000-\u001f\u007f-\u009f\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
const visible = (s) => String(s).replace(CONTROLS, (c) => {
  const n = c.charCodeAt(0);
  return n < 256 ? "\\x" + n.toString(16).padStart(2, "0") : "\\u" + n.toString(16).padStart(4, "0");
});

function el(tag, props, children) {
  const svg = tag === "polyline";
  const node = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "text") node.textContent = visible(v);
    else if (k === "data") for (const [dk, dv] of Object.entries(v)) node.dataset[dk] = String(dv);
    else node.setAttribute(k, k === "title" ? visible(v) : String(v));
  }
  for (const child of children || []) node.appendChild(child);
  return node;
}
