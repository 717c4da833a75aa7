"""Write-ahead submission: a run caught between ``submitting`` and ``submitted`` by a crash is found by key.

The crash is real: the orchestrator runs in a subprocess whose sim backend kills it (SIGKILL) in the
middle of a submission call, once the backend took some of the runs (the sim's ``crash_after`` fault).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from orchestrator import Orchestrator

pytestmark = pytest.mark.anyio

SUBMIT_AND_DIE = textwrap.dedent("""
    import anyio, json, sys
    from pathlib import Path
    from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator

    async def main(home, n, crash_after, run_seconds):
        faults = Path(home) / "backends" / "sim" / "faults.json"
        faults.parent.mkdir(parents=True, exist_ok=True)
        faults.write_text(json.dumps({"crash_after": crash_after}))
        async with Orchestrator(home=home) as orch:
            split = ArgSplitter([[str(i)] for i in range(n)]) if n else None
            j = await orch.jobs.add(Job(name="m", application=Executable("/bin/true"), splitter=split,
                                        backend=Backend("sim", run_seconds=run_seconds)))
            await j.submit()  # the sim kills this process in the middle of it

    anyio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
""")


def submit_and_die(home: Path, n: int, crash_after: int, run_seconds: float | None = None) -> None:
    seconds = run_seconds if run_seconds is not None else 0.5 if not n else 3600
    proc = subprocess.run([sys.executable, "-c", SUBMIT_AND_DIE, str(home), str(n), str(crash_after), str(seconds)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    (home / "backends" / "sim" / "faults.json").write_text("{}")


def ledger(home: Path) -> list[str]:
    path = home / "backends" / "sim" / "submissions.log"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


async def test_restart_adopts_found_runs_and_sends_lost_ones_once(tmp_path: Path) -> None:
    submit_and_die(tmp_path, 6, crash_after=2)
    taken = ledger(tmp_path)
    assert len(taken) == 2  # the backend had two runs when the process died; the other four never reached it
    async with Orchestrator(home=tmp_path) as orch:
        j = orch.jobs[0]
        with anyio.fail_after(10):  # the two are adopted, the four sent again
            while any(s.status == "submitting" for s in j.subjobs):
                await anyio.sleep(0.02)
        subs = list(j.subjobs)
        assert all(s.status in ("submitted", "running") for s in subs)
        assert all(s.info.submit_counter == 1 for s in subs)  # same key, same attempt: no new submission
        adopted = {s.backend_id for s in subs[:2]}
        assert all(b is not None and b.startswith("sim:0.") for b in adopted)
        await j.kill()
    keys = ledger(tmp_path)
    assert len(keys) == len(set(keys)) == 6  # every run reached the backend exactly once
    assert set(taken) <= set(keys)


async def test_single_job_lost_in_flight_is_sent_again(tmp_path: Path) -> None:
    submit_and_die(tmp_path, 0, crash_after=0)
    assert ledger(tmp_path) == []  # it died before the backend took the run
    async with Orchestrator(home=tmp_path) as orch:
        j = orch.jobs[0]
        await j.wait(timeout=10)
        assert j.status == "completed" and j.info.submit_counter == 1  # sent again under the same key
    assert len(ledger(tmp_path)) == 1



async def test_adopted_runs_of_a_reporting_backend_are_watched_to_their_end(tmp_path: Path) -> None:
    """sim reports its runs' ends itself (it is not polled): the runs found by key must be handed to it to watch,
    as the runs reattached at a start are, or they would stay submitted forever."""
    submit_and_die(tmp_path, 4, crash_after=2, run_seconds=0.3)
    async with Orchestrator(home=tmp_path) as orch:
        j = orch.jobs[0]
        await j.wait(timeout=20)
        assert j.status == "completed" and [s.info.submit_counter for s in j.subjobs] == [1, 1, 1, 1]
    keys = ledger(tmp_path)
    assert len(keys) == len(set(keys)) == 4
