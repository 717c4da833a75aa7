"""The status page as a web app done right (issue 22, items 7 and 8), in a real headless Chromium against a real
``orchestrator serve``, attacked from a page that another user serves on another port of 127.0.0.1 (a small HTTP
server of the test's own, which also records what the browser sends it).

- A text/plain form (and a no-cors fetch) posting to ``/api/kill`` while the admin is logged in changes nothing.
- A framed ``/job/ID`` is refused by the browser, and its kill button cannot be reached.
- The cookie the browser sends to the other port holds a session id, never the token, and that id opens nothing.
- ``/job/ID?token=...`` logs in as ``/?token=...`` does, and the page's own kill button works (CSRF token).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import pytest
from chromium import Cdp, Chromium, chromium_binary
from served import Service

pytestmark = pytest.mark.anyio

T = TypeVar("T")


class Attacker:
    """Another user's web server on another port: serves ``pages`` by path, keeps every request's headers."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {}
        self.seen: list[dict[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
                outer.seen.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
                body = outer.pages.get(self.path.split("?")[0], "<!DOCTYPE html><title>x</title>").encode()
                self.send_response(200)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def attacker() -> Iterator[Attacker]:
    site = Attacker()
    site.thread.start()
    try:
        yield site
    finally:
        site.server.shutdown()
        site.server.server_close()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    svc = Service(tmp_path / "home", "--tcp-port", "0")
    try:
        yield svc.start()
    finally:
        svc.stop()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Chromium]:
    binary = chromium_binary()
    if binary is None:
        pytest.skip("chromium is not installed (scripts/install-test-deps.sh installs it)")
    chromium = Chromium(binary, tmp_path / "chromium-profile").start()
    try:
        yield chromium
    finally:
        chromium.stop()


async def eventually(probe: Callable[[], Awaitable[T]], check: Callable[[T], bool], what: str,
                     timeout: float = 15.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if check(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s; last seen: {value!r}")
        await anyio.sleep(0.1)


async def running_job(tmp_path: Path, service: Service) -> str:
    """A job of 2 sim subjobs that run for 10 minutes, submitted and running; its id."""
    path = tmp_path / f"job{len(list(tmp_path.glob('job*.toml')))}.toml"
    path.write_text('name = "long"\n[application]\nexe = "/bin/true"\n[backend]\nname = "sim"\nrun_seconds = 600\n'
                    '[splitter]\ntype = "args"\nargs = [["0"], ["1"]]\n')
    fqid = (await service.cli("submit", str(path))).split()[0]
    await eventually(lambda: status(service, fqid), lambda s: s == "running", f"job {fqid} runs")
    return fqid


async def status(service: Service, fqid: str) -> str:
    async with service.tcp_client() as client:
        return str((await client.get("/api/show", params={"fqid": fqid})).json()["status"])


async def login(page: Cdp, service: Service, path: str = "/") -> None:
    await page.navigate(f"{service.url}{path}?token={service.token}")
    assert await page.evaluate("location.pathname + location.search + location.hash") == path


async def test_a_cross_origin_form_from_another_port_kills_nothing(tmp_path: Path, service: Service,
                                                                    browser: Chromium, attacker: Attacker) -> None:
    fqid = await running_job(tmp_path, service)
    kill = f"{service.url}/api/kill"
    body = json.dumps({"fqid": fqid, "keep_going": True})
    attacker.pages["/form"] = f"""<!DOCTYPE html><html><body>
<form id="f" method="POST" action="{kill}" enctype="text/plain">
<input type="hidden" name='{body[:-1]}, "x": "' value='"}}'></form>
<script>
fetch("{kill}", {{method: "POST", mode: "no-cors", credentials: "include",
  headers: {{"content-type": "text/plain"}}, body: '{body}'}}).finally(() => {{
  window.__fetched = true; document.getElementById("f").submit(); }});
</script></body></html>"""
    page = await browser.page()
    try:
        await login(page, service)
        await page.navigate(f"{attacker.url}/form")
        # The form lands on the service's answer: the refusal, not a kill.
        landed = await eventually(lambda: page.evaluate("location.href + ' ' + document.body.innerText"),
                                  lambda v: v.startswith(kill), "the form is posted")
        assert '"acted"' not in landed and '"error"' in landed, landed
        await anyio.sleep(1.0)
        assert await status(service, fqid) == "running"
    finally:
        await page.close()


async def test_a_framed_job_page_is_refused_and_its_kill_button_cannot_act(tmp_path: Path, service: Service,
                                                                            browser: Chromium,
                                                                            attacker: Attacker) -> None:
    fqid = await running_job(tmp_path, service)
    attacker.pages["/frame"] = (f'<!DOCTYPE html><html><body style="margin:0"><iframe id="v" src="{service.url}'
                                f'/job/{fqid}" style="border:0;width:1200px;height:800px"></iframe></body></html>')
    page = await browser.page()
    try:
        await login(page, service)
        await page.send("DOM.enable")
        await page.navigate(f"{attacker.url}/frame")
        await anyio.sleep(2.0)  # the frame loads (and the job page, if it were shown, reads its job)
        tree = await page.send("Page.getFrameTree")
        children = tree["frameTree"].get("childFrames", [])
        assert len(children) == 1
        frame = children[0]["frame"]
        assert not frame["url"].startswith(service.url), frame  # the browser put its error page instead
        document = await page.send("DOM.getDocument", depth=-1, pierce=True)
        button = _find(document["root"], lambda n: ("id", "kill") in _attrs(n))
        assert button is None, "the framed page's kill button is there"
        await page.send("Input.dispatchMouseEvent", type="mousePressed", x=1150, y=25, button="left", clickCount=1)
        await page.send("Input.dispatchMouseEvent", type="mouseReleased", x=1150, y=25, button="left", clickCount=1)
        await anyio.sleep(1.0)
        assert await status(service, fqid) == "running"
    finally:
        await page.close()


def _attrs(node: dict[str, Any]) -> list[tuple[str, str]]:
    values = node.get("attributes", [])
    return list(zip(values[::2], values[1::2], strict=False))


def _find(node: dict[str, Any], match: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    if match(node):
        return node
    for child in [*node.get("children", []), *([node["contentDocument"]] if "contentDocument" in node else [])]:
        found = _find(child, match)
        if found is not None:
            return found
    return None


async def test_the_cookie_another_port_receives_is_a_session_id_that_opens_nothing(service: Service,
                                                                                   browser: Chromium,
                                                                                   attacker: Attacker) -> None:
    page = await browser.page()
    try:
        await login(page, service)
        await page.navigate(f"{attacker.url}/look")
    finally:
        await page.close()
    sent = [r.get("cookie", "") for r in attacker.seen if r["path"] == "/look"]
    assert sent and service.token not in sent[0]
    cookies = dict(part.strip().split("=", 1) for part in sent[0].split(";") if "=" in part)
    assert list(cookies) == [f"orch_session_{service.port}"], cookies
    sid = cookies[f"orch_session_{service.port}"]
    async with httpx.AsyncClient(base_url=service.url, timeout=10) as thief:
        assert (await thief.get("/api/jobs", headers={"authorization": f"Bearer {sid}"})).status_code == 401
        replayed = {"cookie": f"orch_session_{service.port}={sid}"}
        assert (await thief.get("/api/jobs", headers=replayed)).status_code == 401  # no CSRF token
        assert (await thief.post("/api/kill", json={"fqid": "1"}, headers=replayed)).status_code == 401
    kept = service.home / "service" / "sessions"  # sessions outlive a restart: kept hashed, 0600
    assert kept.stat().st_mode & 0o777 == 0o600
    assert sid not in kept.read_text() and service.token not in kept.read_text()


async def test_a_job_page_logs_in_with_its_token_and_its_kill_button_works(tmp_path: Path, service: Service,
                                                                           browser: Chromium) -> None:
    fqid = await running_job(tmp_path, service)
    page = await browser.page()
    try:
        await login(page, service, f"/job/{fqid}")
        await eventually(lambda: page.evaluate("[document.getElementById('conn').dataset.state, "
                                               "document.getElementById('kill').disabled]"),
                         lambda v: v == ["live", False], "the job page is live, its kill button on")
        await page.evaluate("document.getElementById('kill').click()")
        await eventually(lambda: status(service, fqid), lambda s: s == "killed", "the page's kill kills")
        assert await page.evaluate("document.getElementById('error').textContent") == ""
    finally:
        await page.close()
