"""Write-ahead submission: a run caught between ``submitting`` and ``submitted`` by a crash is found by key."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator

pytestmark = pytest.mark.anyio


def ledger(home: Path) -> list[str]:
    path = home / "backends" / "sim" / "submissions.log"
    return [line.split()[0] for line in path.read_text().splitlines()]


def crash_mid_submission(home: Path, master: int, found: list[int], lost: list[int]) -> None:
    """Make the repository look as if the process died after the driver call but before saving its answers.

    ``found`` subjobs reached the backend (their ledger lines stay); ``lost`` ones never did.
    """
    with sqlite3.connect(home / "repository.sqlite") as db:
        for idx in found + lost:
            db.execute("UPDATE subjobs SET status='submitting', backend_id=NULL WHERE master=? AND idx=?",
                       (master, idx))
    path = home / "backends" / "sim" / "submissions.log"
    keep = [line for line in path.read_text().splitlines()
            if not any(f"-{master}.{i}-" in line.split()[0] for i in lost)]
    path.write_text("".join(f"{line}\n" for line in keep))


async def test_restart_adopts_found_runs_and_sends_lost_ones_once(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        j = await orch.jobs.add(Job(name="m", application=Executable("/bin/true"),
                                    splitter=ArgSplitter([[str(i)] for i in range(6)]),
                                    backend=Backend("sim", run_seconds=3600)))
        await j.submit()
        ids = {s.id: s.backend_id for s in j.subjobs}
    crash_mid_submission(tmp_path, 0, found=[0, 1], lost=[2, 3])
    async with Orchestrator(home=tmp_path) as orch:
        j = orch.jobs[0]
        await orch.engine.wait_for(lambda: not orch.engine.retrying, 10)  # the lost ones are being sent
        subs = list(j.subjobs)
        assert subs[0].backend_id == ids[0] and subs[1].backend_id == ids[1]  # adopted, same run
        assert all(s.status in ("submitted", "running") for s in subs)
        with sqlite3.connect(tmp_path / "repository.sqlite") as db:
            rows = db.execute("SELECT idx, status, info FROM subjobs WHERE master=0").fetchall()
        assert {idx: status for idx, status, _ in rows if status == "submitting"} == {}
        assert all(json.loads(info)["submit_counter"] == 1 for _, _, info in rows)  # same key, same attempt
        await j.kill()
    keys = ledger(tmp_path)
    assert len(keys) == len(set(keys)) == 6  # every run reached the backend exactly once


async def test_single_job_lost_in_flight_is_sent_again(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        j = await orch.jobs.add(Job(name="s", application=Executable("/bin/true"), backend=Backend("sim")))
        await j.submit()
        await j.wait(timeout=10)
    with sqlite3.connect(tmp_path / "repository.sqlite") as db:
        db.execute("UPDATE jobs SET status='submitting', backend_id=NULL WHERE id=0")
    (tmp_path / "backends" / "sim" / "submissions.log").write_text("")
    async with Orchestrator(home=tmp_path) as orch:
        j = orch.jobs[0]
        await j.wait(timeout=10)
        assert j.status == "completed"  # sent again under the same key, since the ledger never had it
    assert len(ledger(tmp_path)) == 1
