"""A master's own page, in real headless Chromium at 1,200 x 700: its grid of subjobs (2,000 fit), failures by
reason with their stderr links, the plot, resubmit and kill clicked on the page, no horizontal scroll; screenshots
are kept as test artifacts."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from chromium import Cdp, Chromium
from served import Service
from test_status_page import browser, eventually, service  # noqa: F401 - fixtures, used by name

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator

pytestmark = pytest.mark.anyio

ARTIFACTS = Path(os.environ.get("ORCH_TEST_ARTIFACTS") or Path(__file__).resolve().parents[2] / "artifacts")
COUNTS = "Object.fromEntries([...document.querySelectorAll('#counts span')].map(s => [s.dataset.count, " \
         "Number(s.textContent.split(' ')[1])]))"


async def test_master_page(service: Service, browser: Chromium) -> None:  # noqa: F811
    async with Orchestrator(home=service.home) as orch:
        j = await orch.jobs.add(Job(name="production", application=Executable("/bin/true"),
                                    splitter=ArgSplitter([[str(i)] for i in range(200)]),
                                    backend=Backend("sim", run_seconds=0.2, outcome={150: ["failed", "completed"],
                                                                                    170: ["failed", "completed"]})))
        await j.submit()
        await j.wait(timeout=60)
        ours = {s: len(j.subjobs.select(status=s)) for s in ("completed", "failed")}
        assert ours == {"completed": 198, "failed": 2}

        page: Cdp = await browser.page()
        try:
            await page.send("Emulation.setDeviceMetricsOverride", width=1200, height=700, deviceScaleFactor=1,
                            mobile=False)
            await page.navigate(f"{service.url}/?token={service.token}")  # the token becomes a cookie
            await eventually(lambda: page.evaluate("document.querySelectorAll('#rows a').length"),
                             lambda n: n == 1, "the list links to the master's page")
            assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
            await page.navigate(f"{service.url}/job/{j.fqid}")
            await eventually(lambda: page.evaluate("document.querySelectorAll('#grid .cell').length"),
                             lambda n: n == 200, "one cell per subjob")
            assert await page.evaluate(COUNTS) == ours  # the page's counts are the API's
            cells: list[dict[str, Any]] = await page.evaluate(
                "[...document.querySelectorAll('#grid .cell[data-status=failed]')].map(c => ({i: c.dataset.index, "
                "title: c.title}))")
            assert [c["i"] for c in cells] == ["150", "170"]
            assert all("sim: outcome failed" in c["title"] for c in cells)  # hover names the subjob and why
            groups = await page.evaluate("[...document.querySelectorAll('#failures tr')].map(r => "
                                         "[r.cells[0].textContent, r.cells[1].textContent, "
                                         "[...r.querySelectorAll('a')].map(a => a.getAttribute('href'))])")
            assert len(groups) == 1 and groups[0][1] == "2"
            csrf = await page.evaluate("localStorage.getItem('orch_csrf')")  # the session's, given at login
            assert groups[0][2] == [f"/peek/{j.fqid}.150/stderr?csrf={csrf}", f"/peek/{j.fqid}.170/stderr?csrf={csrf}"]
            series = await page.evaluate("[...document.querySelectorAll('#plot polyline')].map(p => p.dataset.series)")
            assert series == ["completed", "failed"]
            assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")  # no h-scroll
            await eventually(lambda: page.evaluate("document.getElementById('conn').dataset.state"),
                             lambda state: state == "live", "the page follows the bus")

            shot = await page.send("Page.captureScreenshot", format="png")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            (ARTIFACTS / "status-master-1200x700.png").write_bytes(base64.b64decode(shot["data"]))

            await page.evaluate("document.getElementById('resubmit').click()")  # through the same API
            await eventually(lambda: page.evaluate(COUNTS), lambda c: c == {"completed": 200},
                             "the failed subjobs were resubmitted and completed", timeout=30)
        finally:
            await page.close()
        with anyio.fail_after(10):
            while j.status != "completed":
                await anyio.sleep(0.1)
        assert [s.info.submit_counter for s in j.subjobs.select(ids=[150, 170])] == [2, 2]


#: A local master: subjob i says "line i"; subjob 1 also complains on stderr and fails.
COMPLAIN = 'echo "line $1"; if [ "$1" = 1 ]; then echo "calibration file missing for $1" >&2; exit 4; fi'


async def test_peek_links_kill_button_and_two_thousand_cells(service: Service, browser: Chromium) -> None:  # noqa: F811
    async with Orchestrator(home=service.home) as orch:
        local = await orch.jobs.add(Job(name="local", application=Executable("/bin/sh"), backend="local",
                                        splitter=ArgSplitter([["-c", COMPLAIN, "sh", str(i)] for i in range(3)])))
        big = await orch.jobs.add(Job(name="big", application=Executable("/bin/true"),
                                      splitter=ArgSplitter([[str(i)] for i in range(2000)]),
                                      backend=Backend("sim", run_seconds=600,
                                                      queued={i: 600 for i in range(1000, 2000)})))
        await local.submit()
        await big.submit()
        await local.wait(timeout=60)
        assert [s.status.value for s in local.subjobs] == ["completed", "failed", "completed"]

        page: Cdp = await browser.page()
        try:
            await page.send("Emulation.setDeviceMetricsOverride", width=1200, height=700, deviceScaleFactor=1,
                            mobile=False)
            await page.navigate(f"{service.url}/?token={service.token}")

            # The failure's stderr link, fetched as a click would (the page's own cookie): the run's stderr.
            await page.navigate(f"{service.url}/job/{local.fqid}")
            links = await eventually(lambda: page.evaluate(
                "[...document.querySelectorAll('#failures a')].map(a => a.getAttribute('href'))"),
                lambda hrefs: bool(hrefs), "a link to the failed run's stderr")
            csrf = await page.evaluate("localStorage.getItem('orch_csrf')")  # the session's, given at login
            assert csrf and links == [f"/peek/{local.fqid}.1/stderr?csrf={csrf}"]
            text = await page.evaluate(f"fetch({links[0]!r}, {{credentials: 'same-origin'}}).then(r => r.text())")
            assert text == "calibration file missing for 1\n"

            # 2,000 cells fit 1,200 px: the grid scrolls down if it must, never sideways.
            await page.navigate(f"{service.url}/job/{big.fqid}")
            await eventually(lambda: page.evaluate("document.querySelectorAll('#grid .cell').length"),
                             lambda n: n == 2000, "one cell per subjob")
            await eventually(lambda: page.evaluate(COUNTS), lambda c: c == {"running": 1000, "submitted": 1000},
                             "the cells and counts follow the runs")
            assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
            assert await page.evaluate("document.getElementById('grid').scrollWidth "
                                       "<= document.getElementById('grid').clientWidth")
            shot = await page.send("Page.captureScreenshot", format="png")
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            (ARTIFACTS / "status-master-2000-1200x700.png").write_bytes(base64.b64decode(shot["data"]))

            # The kill button goes through the same API: every active subjob is killed, the grid says so.
            assert await page.evaluate("document.getElementById('kill').disabled") is False
            await page.evaluate("document.getElementById('kill').click()")
            await eventually(lambda: page.evaluate(COUNTS), lambda c: c == {"killed": 2000},
                             "the kill clicked on the page reached every subjob", timeout=30)
            assert await page.evaluate("document.querySelectorAll('#grid .cell[data-status=killed]').length") == 2000
            await eventually(lambda: page.evaluate("document.getElementById('kill').disabled"), lambda d: d is True,
                             "nothing left to kill")
        finally:
            await page.close()
        await big.wait(timeout=60)  # this client follows the service's stream: it hears of the kill in a moment
        assert big.status == "killed" and len(big.subjobs.select(status="killed")) == 2000
