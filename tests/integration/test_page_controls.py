"""The status page shows a job's control characters as escapes (``\\x1b``), as the command line does: a name
with a bidirectional override cannot reorder what the page shows. A real headless Chromium reads the DOM of the
pages a real ``orchestrator serve`` serves."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from chromium import Chromium
from served import Service

pytestmark = pytest.mark.anyio

from test_status_page import browser, service  # noqa: E402,F401 - the page tests' fixtures, used by name

NAME = "a\x1b[2Jb\u202eevil\x07"
SHOWN = "a\\x1b[2Jb\\u202eevil\\x07"




async def test_the_pages_show_control_characters_as_escapes(tmp_path: Path, service: Service,  # noqa: F811
                                                            browser: Chromium) -> None:  # noqa: F811
    jobfile = tmp_path / "job.toml"
    jobfile.write_text(f'name = {json.dumps(NAME)}\n[application]\nexe = "/bin/true"\n[backend]\nname = "sim"\n'
                       f'run_seconds = 0.05\noutcome = {{ 1 = "failed" }}\n[splitter]\ntype = "args"\n'
                       f'args = [["0"], ["1"]]\n')
    fqid = (await service.cli("submit", str(jobfile))).split()[0]
    page = await browser.page()
    try:
        await page.navigate(f"{service.url}/?token={service.token}")
        row = await _until(page, f"""(() => {{ const tr = document.querySelector("tr[data-fqid='{fqid}']");
            if (!tr || tr.dataset.status !== "failed") return null;
            const td = tr.querySelector("td.name");
            return {{name: td.textContent, title: td.title}}; }})()""")
        assert row == {"name": SHOWN, "title": SHOWN}
        await page.navigate(f"{service.url}/job/{fqid}")
        title = await _until(page, "document.getElementById('title').textContent.includes('evil') ? "
                                   "document.getElementById('title').textContent : null")
        assert title == f"job {fqid} {SHOWN}"
    finally:
        await page.close()


async def _until(page: Any, script: str, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while (value := await page.evaluate(script)) is None:
        assert time.monotonic() < deadline, f"not within {timeout} s: {script}"
        await anyio.sleep(0.1)
    return value
