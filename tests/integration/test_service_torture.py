"""Torture: the service under real supervisord, SIGKILLed at random while it submits and monitors.

Every subjob must complete exactly once, the masters must be right, and no
backend may have seen a run twice: the local backend's events file has one
START per subjob (a START is written by the wrapper itself, so it counts real
starts), and the sim backend's ledger one accepted submission per subjob.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from supervised import Robust, Supervised, duplicates, stored_subjobs

from orchestrator import ArgSplitter, Backend, Executable, Job

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LOCAL_N = 1000
SIM_N = 200
KILLS = 10


def local_job(runs: Path, rng: random.Random) -> Job:
    script = 'sleep "$1"; echo "$2" >> "$3"'
    args = [["-c", script, "sh", f"{rng.uniform(0.1, 1.0):.2f}", str(i), str(runs)] for i in range(LOCAL_N)]
    return Job(name="torture-local", application=Executable("/bin/sh"), splitter=ArgSplitter(args), backend="local")


def sim_job() -> Job:
    return Job(name="torture-sim", application=Executable("/bin/true"),
               splitter=ArgSplitter([[str(i)] for i in range(SIM_N)]), backend=Backend("sim", run_seconds=3.0))


def starts_per_fqid(events: Path) -> list[str]:
    """The fqid of every START line: keys are ``orch-<home>-<fqid>-<attempt>``."""
    out = []
    for line in events.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1] == "START":
            out.append(parts[0].split("-")[2])
    return out


def ledger_fqids(ledger: Path) -> list[str]:
    return [line.split()[0].split("-")[2] for line in ledger.read_text().splitlines() if line.strip()]


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Supervised]:
    sup = Supervised(tmp_path / "home")
    sup.start()
    yield sup
    sup.stop()


async def test_sigkill_ten_times_loses_and_duplicates_nothing(supervised: Supervised, tmp_path: Path) -> None:
    rng = random.Random(3)
    home = supervised.home
    runs = tmp_path / "runs.txt"
    await supervised.ready()
    api = Robust(home, deadline=time.monotonic() + 400)
    fqids: list[str] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(supervised.kill_at_random, KILLS, 0.3, 2.5, rng)
        for job in (local_job(runs, rng), sim_job()):
            fqids.append(await api.add_and_submit(job.name, job.spec()))
    assert supervised.kills == KILLS
    masters = await api.wait_final(fqids)

    assert [m["status"] for m in masters] == ["completed", "completed"], masters
    assert masters[0]["counts"] == {"completed": LOCAL_N} and masters[1]["counts"] == {"completed": SIM_N}
    lines = runs.read_text().split()
    assert duplicates(lines) == {} and sorted(map(int, lines)) == list(range(LOCAL_N))  # each ran exactly once
    local, sim = fqids
    starts = starts_per_fqid(home / "backends" / "local" / "events.log")
    assert duplicates(starts) == {} and len(starts) == LOCAL_N
    accepted = ledger_fqids(home / "backends" / "sim" / "submissions.log")
    assert duplicates(accepted) == {} and len(accepted) == SIM_N
    for master, n in ((local, LOCAL_N), (sim, SIM_N)):
        rows = await stored_subjobs(home, master)
        assert len(rows) == n and {status for _, status, _ in rows} == {"completed"}
        assert {counter for _, _, counter in rows} == {1}  # one attempt each: nothing was sent twice
