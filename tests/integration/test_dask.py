"""The ``dask`` backend on a real ``distributed.LocalCluster``: the backend tests ``local`` passes."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import anyio
import pytest

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator, RetryPolicy

pytest.importorskip("distributed", reason="distributed (the dask extra) is not installed")

pytestmark = pytest.mark.anyio

FAST = {"core": {"poll_interval": 0.1}}


def processes_with(marker: str) -> list[int]:
    """Pids whose command line holds ``marker`` (the wrapper's and the application's)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


async def test_fifty_subjobs_a_retried_failure_and_a_kill(tmp_path: Path) -> None:
    flaky = 'if [ "$ORCH_RETRY_COUNT" = 0 ] && [ "$1" = 7 ]; then exit 3; fi; echo "out $1"'
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        j = await orch.jobs.add(Job(name="scan", application=Executable("/bin/sh"),
                                    splitter=ArgSplitter([["-c", flaky, "sh", str(i)] for i in range(50)]),
                                    backend=Backend("dask", workers=2),
                                    retry=RetryPolicy(max_early=1, max_late_handled=0, max_late_unhandled=0)))
        await j.submit()
        await j.wait(timeout=120)
        assert j.status == "completed", [(s.fqid, s.status.value, s.info.reason) for s in j.subjobs if
                                         s.status != "completed"]
        assert all((s.outputdir / "stdout").read_text() == f"out {s.id}\n" for s in j.subjobs)
        retried = j.subjobs[7]
        [entry] = retried.info.history  # exit 3 without a keyword: application level, early, retried once
        assert (entry["level"], entry["verdict"], entry["action"]) == ("application", "early", "retry")
        assert retried.info.submit_counter == 2

        marker = f"60.{uuid.uuid4().int % 10**9:09d}"  # a sleep of its own: its command line finds it
        long = await orch.jobs.add(Job(name="long", application=Executable("/bin/sh"),
                                       splitter=ArgSplitter([["-c", f"sleep {marker}; echo done"]] * 4),
                                       backend=Backend("dask", workers=2)))
        await long.submit()
        with anyio.fail_after(60):
            while len(long.subjobs.select(status="running")) < 2:
                await anyio.sleep(0.1)
        assert processes_with(marker)
        await long.kill()
        await long.wait(timeout=30)
        assert [s.status.value for s in long.subjobs] == ["killed"] * 4
        with anyio.fail_after(10):  # the application and its wrapper are gone, on every worker
            while processes_with(marker):
                await anyio.sleep(0.1)
