"""The service's live status page, in a real headless Chromium against a real ``orchestrator serve``.

The service runs as a subprocess on a fresh home with ``--tcp-port 0``; jobs
are added and killed with the ``orchestrator`` command line, which talks to
that service. The browser logs in with ``/?token=...`` and is then only
watched: every check reads the page's DOM over the DevTools protocol, and a
marker set on ``window`` after the first load shows the page was never
reloaded, so what it shows came through its event stream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import pytest
from chromium import Cdp, Chromium, chromium_binary
from served import Service

pytestmark = pytest.mark.anyio

STATUSES = ["new", "submitting", "submitted", "running", "completing", "completed", "failed", "killed", "held"]
#: Seconds the page may take to show a change.
UPDATE_TIMEOUT = 10.0

T = TypeVar("T")


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


def sim_job(tmp_path: Path, name: str, n: int, run_seconds: float, failed: tuple[int, ...] = ()) -> Path:
    path = tmp_path / f"job{len(list(tmp_path.glob('job*.toml')))}.toml"
    outcome = ", ".join(f'{i} = "failed"' for i in failed)
    args = ", ".join(f'["{i}"]' for i in range(n))
    path.write_text(f"""
name = {json.dumps(name)}
[application]
exe = "/bin/true"
[backend]
name = "sim"
run_seconds = {run_seconds}
outcome = {{ {outcome} }}
[splitter]
type = "args"
args = [{args}]
""")
    return path


#: What the page shows, row by row: the same shape as ``GET /api/jobs`` plus what only the page has.
READ_ROWS = """
Array.from(document.querySelectorAll("#rows > tr")).map((tr) => ({
  fqid: tr.dataset.fqid,
  status: tr.dataset.status,
  name: tr.querySelector("td.name").textContent,
  owner: tr.querySelector("td.owner").textContent,
  backend: tr.children[4].textContent,
  subjobs: Number(tr.querySelector("td.subjobs").textContent),
  counts: Object.fromEntries(Array.from(tr.querySelectorAll("td[data-count]"))
    .filter((td) => td.textContent !== "" && td.textContent !== "0")
    .map((td) => [td.dataset.count, Number(td.textContent)])),
  cells: Array.from(tr.querySelectorAll("td[data-count]")).map((td) => td.dataset.count),
  segments: Array.from(tr.querySelectorAll(".bar > .seg")).map((s) => [s.dataset.status, parseFloat(s.style.width)]),
  elements: tr.querySelectorAll("td.name *").length,
}))
"""


def visible(job: dict[str, Any]) -> dict[str, Any]:
    """The part of a ``/api/jobs`` entry the page shows."""
    return {k: job[k] for k in ("fqid", "status", "name", "owner", "backend", "subjobs", "counts")}


async def eventually(probe: Callable[[], Awaitable[T]], check: Callable[[T], bool], what: str,
                     timeout: float = UPDATE_TIMEOUT) -> T:
    """Poll ``probe`` until ``check`` holds on its value; fail with the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if check(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s; last seen: {value!r}")
        await anyio.sleep(0.1)


async def test_root_over_tcp_needs_the_token(service: Service) -> None:
    async with httpx.AsyncClient(base_url=service.url, timeout=10) as anonymous:
        refused = await anonymous.get("/")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert refused.json()["error"] == "unauthorized" and "<html" not in refused.text
        assert (await anonymous.get("/api/jobs")).status_code == 401
        assert (await anonymous.get("/?token=not-the-token")).status_code == 401
        login = await anonymous.get(f"/?token={service.token}")
        assert login.status_code == 303 and login.headers["location"].startswith("/#csrf=")
        assert "HttpOnly" in login.headers["set-cookie"]
        page = await anonymous.get("/")  # the cookie the login set
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        # The API wants the session's CSRF token besides its cookie.
        assert (await anonymous.get("/api/jobs")).status_code == 401
        csrf = login.headers["location"].removeprefix("/#csrf=")
        assert (await anonymous.get("/api/jobs", headers={"x-csrf-token": csrf})).status_code == 200
    async with service.tcp_client() as client:
        page = await client.get("/")
        assert page.status_code == 200 and "new EventSource(`/api/events?csrf=" in page.text


async def test_page_follows_jobs_live(tmp_path: Path, service: Service, browser: Chromium) -> None:
    page: Cdp = await browser.page()
    try:
        await check_page(tmp_path, service, page)
    finally:
        await page.close()


async def check_page(tmp_path: Path, service: Service, page: Cdp) -> None:
    async def rows() -> list[dict[str, Any]]:
        value = await page.evaluate(READ_ROWS)
        assert isinstance(value, list)
        return value

    async def row(fqid: str) -> dict[str, Any] | None:
        return next((r for r in await rows() if r["fqid"] == fqid), None)

    await page.send("Runtime.enable")  # uncaught script errors arrive as Runtime.exceptionThrown events
    await page.navigate(f"{service.url}/?token={service.token}")
    assert await page.evaluate("location.pathname + location.search") == "/"  # the token left the address bar
    assert await page.evaluate("document.cookie") == ""  # HttpOnly: not readable by scripts
    await page.evaluate("window.__notReloaded = true")
    await eventually(lambda: page.evaluate("document.getElementById('conn').dataset.state"),
                     lambda state: state == "live", "the event stream connects")
    await eventually(lambda: page.evaluate("[Number(jobs.dataset.loads), empty.hidden]"),
                     lambda v: v[0] >= 1 and v[1] is False, "the empty table is shown")
    assert await page.evaluate("document.querySelectorAll('#jobs thead th').length") == 7 + len(STATUSES)

    # A long job to kill, with a name that is HTML; and a job of 20 whose subjobs 2, 5 and 11 fail.
    tricky = '<img src=x onerror="window.__pwned=1"> & <b>'
    long_id = (await service.cli("submit", str(sim_job(tmp_path, tricky, 6, run_seconds=600)))).split()[0]
    scan_id = (await service.cli("submit", str(sim_job(tmp_path, "scan", 20, 3.0, failed=(2, 5, 11))))).split()[0]

    # While they run, the page agrees with the API (both poll until they settle on the same view).
    async with service.tcp_client() as client:
        async def both() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            api = [visible(j) for j in (await client.get("/api/jobs")).json()]
            shown = [visible(r) for r in await rows()]
            return api, shown

        api, shown = await eventually(both, lambda v: v[0] == v[1] and len(v[0]) == 2, "page == /api/jobs")
        assert [j["fqid"] for j in shown] == [long_id, scan_id]

    running = await eventually(lambda: row(long_id),
                               lambda r: r is not None and r["status"] == "running" and r["counts"] == {"running": 6},
                               "the long job shows 6 running")
    assert running is not None
    assert running["name"] == tricky and running["elements"] == 0  # text, not markup
    assert running["cells"] == STATUSES  # a count cell for every status, empty ones included
    assert running["segments"] == [["running", 100.0]]
    assert running["subjobs"] == 6 and running["backend"] == "sim"

    # The scan ends by itself: 17 completed, 3 failed, and the master failed.
    done = await eventually(lambda: row(scan_id),
                            lambda r: r is not None and r["status"] == "failed", "the scan ends failed", timeout=20)
    assert done is not None
    assert done["counts"] == {"completed": 17, "failed": 3} and done["subjobs"] == 20
    assert done["segments"] == [["completed", 85.0], ["failed", 15.0]]
    assert await page.evaluate("document.querySelector(`tr[data-fqid='" + scan_id
                               + "'] .seg[data-status=failed]`).title") == "failed: 3 of 20 (15.0%)"

    # A kill from the command line shows up without a reload.
    assert (await service.cli("kill", long_id)).strip() == f"job {long_id}: killed"
    killed = await eventually(lambda: row(long_id), lambda r: r is not None and r["status"] == "killed",
                              "the killed job shows killed")
    assert killed is not None and killed["counts"] == {"killed": 6} and killed["segments"] == [["killed", 100.0]]

    async with service.tcp_client() as client:
        api = [visible(j) for j in (await client.get("/api/jobs")).json()]
    assert [visible(r) for r in await rows()] == api
    state = await page.evaluate("({kept: window.__notReloaded === true, pwned: window.__pwned === 1,"
                                " events: Number(jobs.dataset.events), error: error.textContent,"
                                " title: document.title, conn: conn.dataset.state})")
    assert state["kept"] and not state["pwned"]
    assert state["events"] >= 3 and state["error"] == "" and state["conn"] == "live"
    assert state["title"] == "orchestrator"  # nothing active any more
    assert [e for e in page.events if e.get("method") == "Runtime.exceptionThrown"] == []


async def test_page_reconnects_after_the_service_restarts(tmp_path: Path, service: Service, browser: Chromium) -> None:
    page = await browser.page()
    try:
        await page.navigate(f"{service.url}/?token={service.token}")
        conn = "document.getElementById('conn').dataset.state"
        await eventually(lambda: page.evaluate(conn), lambda state: state == "live", "the event stream connects")
        await page.evaluate("window.__notReloaded = true")
        port = service.port
        service.stop()
        await eventually(lambda: page.evaluate(conn), lambda state: state != "live", "the page sees the drop")
        service.args = ("--tcp-port", str(port))
        service.start()  # same home, same port, same token: the page's cookie still holds
        job_id = (await service.cli("submit", str(sim_job(tmp_path, "after", 3, 0.2)))).split()[0]
        done = await eventually(
            lambda: page.evaluate(READ_ROWS),
            lambda rows: [(r["fqid"], r["status"], r["counts"]) for r in rows] == [(job_id, "completed",
                                                                                   {"completed": 3})],
            "the page shows the job submitted after the restart", timeout=20)
        assert done
        assert await page.evaluate(conn) == "live" and await page.evaluate("window.__notReloaded") is True
    finally:
        await page.close()
