"""A run's times are those of its log (docs/design.md, "Watching"; docs/reference.md, ``timestamps``): when it
started and ended, not when someone looked; a master's end times only once it is final. Real ``local`` runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from orchestrator import ArgSplitter, Executable, Job, Orchestrator

pytestmark = pytest.mark.anyio

EXE = str(Path(sys.executable).with_name("orchestrator"))


def log_times(outputdir: Path) -> tuple[float, float] | None:
    """The START and END times of the wrapper's log of attempt 1 (``orch.1.log``, ``orch.log`` once read)."""
    for name in ("orch.1.log", "orch.log"):
        try:
            lines = (outputdir / name).read_text().splitlines()
        except FileNotFoundError:
            continue
        words = {line.split()[1]: float(line.split()[0]) for line in lines if len(line.split()) >= 2}
        if "START" in words and "END" in words:
            return words["START"], words["END"]
    return None


async def test_a_run_that_ended_while_nobody_watched_keeps_the_times_of_its_log(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with Orchestrator(home=home) as orch:
        job = await orch.jobs.add(Job(name="t", application=Executable("/bin/sh"), backend="local",
                                      splitter=ArgSplitter([["-c", "sleep 0.3; exit 0"], ["-c", "sleep 0.3; exit 3"]])))
        await job.submit()
        outdirs = [sub.outputdir for sub in job.subjobs]
    # closed: the runs go on, end, and nobody looks until well after
    with anyio.fail_after(30):
        while not all(log_times(d) for d in outdirs):
            await anyio.sleep(0.05)
    await anyio.sleep(1.5)
    async with Orchestrator(home=home) as orch:
        job = orch.jobs[0]
        await job.wait(timeout=30)
        assert [s.status for s in job.subjobs] == ["completed", "failed"]
        times = [log_times(d) for d in outdirs]
        for sub, found in zip(job.subjobs, times, strict=True):
            assert found is not None
            start, end = found
            stamps = sub.info.timestamps
            assert stamps["running"] == pytest.approx(start, abs=1e-6), stamps
            assert stamps["final"] == pytest.approx(end, abs=1e-6), stamps
            assert stamps[sub.status.value] == pytest.approx(end, abs=1e-6), stamps
        top = job.info.timestamps
        assert top["running"] == pytest.approx(min(s for s, _ in times if s), abs=1e-6), top  # type: ignore[misc]
        assert top["final"] == pytest.approx(max(e for _, e in times if e), abs=1e-6), top  # type: ignore[misc]
        assert top["failed"] == pytest.approx(times[1][1], abs=1e-6), top  # type: ignore[index]
        assert top["completed"] == pytest.approx(times[0][1], abs=1e-6), top  # type: ignore[index]
    shown = json.loads(subprocess.run([EXE, "--home", str(home), "show", "0", "--json"], capture_output=True,
                                      text=True, timeout=60, check=True).stdout)
    assert shown["started_at"] == pytest.approx(top["running"]) and shown["ended_at"] == pytest.approx(top["final"])
    assert shown["run_seconds"] == pytest.approx(top["final"] - top["running"])
    rows = shown["subjob_rows"]
    assert [r["ended_at"] for r in rows] == [pytest.approx(t[1]) for t in times]  # type: ignore[index]
    assert [r["started_at"] for r in rows] == [pytest.approx(t[0]) for t in times]  # type: ignore[index]


async def test_a_master_has_end_times_only_once_it_is_final(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path / "home") as orch:
        job = await orch.jobs.add(Job(name="t", application=Executable("/bin/sh"), backend="local",
                                      splitter=ArgSplitter([["-c", "exit 0"], ["-c", "sleep 60"]])))
        await job.submit()
        with anyio.fail_after(30):
            while job.subjobs[0].status != "completed" or job.subjobs[1].status != "running":
                await anyio.sleep(0.05)
        stamps = job.info.timestamps
        assert job.status == "running"
        assert not {"final", "completed", "failed", "killed"} & stamps.keys(), stamps
        assert "running" in stamps
        await job.kill()
        await job.wait(timeout=30)
        stamps = job.info.timestamps
        ends = [s.info.timestamps["final"] for s in job.subjobs]
        assert stamps["final"] == max(ends) and stamps["killed"] == ends[1] and stamps["completed"] == ends[0]
        await job.subjobs[1].resubmit()  # active again: its end times are gone until it is final again
        assert not {"final", "completed", "killed"} & job.info.timestamps.keys(), job.info.timestamps
        await job.kill()
        await job.wait(timeout=30)
        assert "final" in job.info.timestamps
