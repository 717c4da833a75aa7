"""The status pages as a Ganga user read them (issue: a first day), in real headless Chromium at 1,200 x 700:
every status's name whole in the list's header, one group per cause of failure however the failures' numbers
differ, and a master's page opened straight from its address with the token."""

from __future__ import annotations

from typing import Any

import pytest
from chromium import Cdp, Chromium
from served import Service
from test_status_page import browser, eventually, service  # noqa: F401 - fixtures, used by name

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator

pytestmark = pytest.mark.anyio

WIDTHS = "[...document.querySelectorAll('#head th')].map(th => [th.textContent, th.getBoundingClientRect().width])"
#: Each header cell: its text, and whether that text fits its cell (measured as laid out, overflow or not).
HEADERS = ("[...document.querySelectorAll('#head th')].map(th => { const r = document.createRange(); "
           "r.selectNodeContents(th); return [th.textContent, r.getBoundingClientRect().width "
           "<= th.getBoundingClientRect().width + 0.5]; })")


async def test_headers_whole_causes_grouped_and_a_job_page_from_its_address(service: Service,  # noqa: F811
                                                                          browser: Chromium) -> None:  # noqa: F811
    script = 'echo "no calibration for point $0" >&2; exit 3'
    async with Orchestrator(home=service.home) as orch:
        # every status at once in the list: one job per status, so that each has its header column
        failing = await orch.jobs.add(Job(name="calibration", application=Executable("/bin/sh"),
                                          splitter=ArgSplitter([["-c", script, str(i)] for i in (13, 42, 77)]),
                                          backend="local"))
        await failing.submit()
        sims = await orch.jobs.add(Job(name="mixed", application=Executable("/bin/true"),
                                       splitter=ArgSplitter([[str(i)] for i in range(6)]),
                                       backend=Backend("sim", run_seconds=600, queued={0: 600}, outcome={1: "held"})))
        await sims.submit()
        await failing.wait(timeout=60)
        assert failing.status == "failed"
        page: Cdp = await browser.page()
        try:
            await page.send("Emulation.setDeviceMetricsOverride", width=1200, height=700, deviceScaleFactor=1,
                            mobile=False)
            # straight to a master's page from its address, the token in it (the page a colleague was sent)
            await page.navigate(f"{service.url}/job/{failing.fqid}?token={service.token}")
            await eventually(lambda: page.evaluate("document.querySelectorAll('#failures tr').length"),
                             lambda n: n == 1, "the three failures, one cause: one group")
            group: list[Any] = await page.evaluate("[...document.querySelectorAll('#failures tr')].map(r => "
                                                   "[r.cells[0].textContent, r.cells[1].textContent])[0]")
            assert group[1] == "3" and "no calibration for point #" in group[0], group
            assert "?token=" not in await page.evaluate("location.href")
            await page.navigate(f"{service.url}/")
            await eventually(lambda: page.evaluate("document.querySelectorAll('#rows tr').length"),
                             lambda n: n == 2, "both jobs listed")
            headers: list[list[Any]] = await page.evaluate(HEADERS)
            assert [h for h, fits in headers if not fits] == [], await page.evaluate(WIDTHS)
            assert {"name", "submitted", "running", "failed"} <= {h for h, _ in headers}
            assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        finally:
            await page.close()
        await sims.kill()
