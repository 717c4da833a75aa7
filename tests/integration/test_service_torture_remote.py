"""Torture on remote backends: the service under supervisord, SIGKILLed 3 times, with 100 subjobs on a
real sshd and 100 on a real Slurm cluster. Each subjob must run exactly once (every execution appends a
line to a side file the test reads) and complete, with one attempt and one backend id of its own.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from slurmd import SlurmCluster, slurm_cluster  # noqa: F401 - the session fixture, used by name
from sshd import SshEnv
from supervised import Robust, Supervised, duplicates, stored_subjobs

from orchestrator import ArgSplitter, Backend, Executable, Job

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

N = 100
KILLS = 3


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Supervised]:
    sup = Supervised(tmp_path / "home")
    sup.home.mkdir(parents=True)
    (sup.home / "orchestrator.toml").write_text("[core]\npoll_interval = 0.25\n")
    sup.start()
    yield sup
    sup.stop()


def counting_job(name: str, side: Path, backend: Backend, rng: random.Random) -> Job:
    """``N`` subjobs; subjob i sleeps a little and appends a line to ``side/i``."""
    script = 'sleep "$1"; echo ran >> "$2/$0"'
    args = [["-c", script, str(i), f"{rng.uniform(0.1, 0.8):.2f}", str(side)] for i in range(N)]
    return Job(name=name, application=Executable("/bin/sh"), splitter=ArgSplitter(args), backend=backend)


async def torture(sup: Supervised, job: Job, side: Path, seed: int, deadline: float) -> None:
    rng = random.Random(seed)
    await sup.ready()
    api = Robust(sup.home, deadline=time.monotonic() + deadline)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sup.kill_at_random, KILLS, 0.5, 3.0, rng)
        fqid = await api.add_and_submit(job.name, job.spec())
    assert sup.kills == KILLS
    (master,) = await api.wait_final([fqid])
    assert master["status"] == "completed" and master["counts"] == {"completed": N}, master
    runs = {i: len((side / str(i)).read_text().split()) if (side / str(i)).exists() else 0 for i in range(N)}
    assert {i: n for i, n in runs.items() if n != 1} == {}  # every subjob ran exactly once
    rows = await stored_subjobs(sup.home, fqid)
    assert {status for _, status, _ in rows} == {"completed"} and {c for _, _, c in rows} == {1}
    detail = await api.read("show", fqid=fqid, subjobs=N)
    ids = [row["backend_id"] for row in detail["subjob_rows"]]
    assert None not in ids and duplicates(ids) == {}  # one run at the backend per subjob


async def test_ssh_hundred_subjobs_three_kills(supervised: Supervised, ssh_env: SshEnv, side: Path) -> None:
    backend = Backend("ssh", **ssh_env.settings(slots=16))
    await torture(supervised, counting_job("torture-ssh", side, backend, random.Random(4)), side, 4, 300)


async def test_slurm_hundred_subjobs_three_kills(supervised: Supervised, slurm_cluster: SlurmCluster,  # noqa: F811
                                                 side: Path) -> None:
    backend = Backend("slurm", slurm_conf=str(slurm_cluster.conf))
    await torture(supervised, counting_job("torture-slurm", side, backend, random.Random(5)), side, 5, 600)
