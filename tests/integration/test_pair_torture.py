"""Failover torture: an active/standby pair under real supervisord, the active service SIGKILLed 5 times.

Two homes (two hosts) on one PostgreSQL repository, each with its own
supervisord running the project's ``config/supervisord.conf``; the job
workspaces and the drivers' state are in the directory both share. While
200 subjobs run on ``ssh`` (two loopback sshds) and 500 on ``sim``, the
active service is SIGKILLed 5 times at random moments: each time the other
must answer as the active one within 10 s (supervisord brings the killed one
back as the standby). At the end every subjob completed exactly once (every
ssh run appends a line to a side file on the hosts), with one attempt each,
and no backend saw a run twice: one accepted submission per sim subjob in its
ledger, one launch per ssh run in the hosts' event log, each under the
repository's one key prefix.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from pair import Following, Pair, pair_homes
from sshd import SshEnv
from stored import home_key
from supervised import duplicates, stored_subjobs

from orchestrator import ArgSplitter, Backend, Executable, Job

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

SSH_N = 200
SIM_N = 500
KILLS = 5
#: DESIGN: on the leader's death the standby takes over within this many seconds.
TAKEOVER_LIMIT = 10.0


@pytest.fixture
def pair(pg_url: str, tmp_path: Path) -> Iterator[Pair]:
    a, b, shared = pair_homes(tmp_path, pg_url, core="poll_interval = 0.25")
    both = Pair(a, b)
    both.start()
    yield both
    both.stop()


def ssh_job(side: Path, env: SshEnv, rng: random.Random) -> Job:
    """Subjob i sleeps a little, then appends a line to ``side/i`` on the host it ran on."""
    script = 'sleep "$1"; echo ran >> "$2/$0"'
    args = [["-c", script, str(i), f"{rng.uniform(0.3, 2.0):.2f}", str(side)] for i in range(SSH_N)]
    return Job(name="pair-ssh", application=Executable("/bin/sh"), splitter=ArgSplitter(args),
               backend=Backend("ssh", **env.settings(slots=8)))


def sim_job() -> Job:
    return Job(name="pair-sim", application=Executable("/bin/true"),
               splitter=ArgSplitter([[str(i)] for i in range(SIM_N)]), backend=Backend("sim", run_seconds=10.0))


def launches(env: SshEnv, shared: Path) -> list[str]:
    """The key of every run the hosts started (the ssh driver's namespace is in the shared state dir)."""
    namespace = (shared / "backends" / "ssh" / "namespace").read_text().strip()
    events = (env.workdir / namespace / "events.log").read_text().splitlines()
    return [line.split()[0] for line in events if len(line.split()) > 1 and line.split()[1] == "LAUNCH"]


def ledger(shared: Path) -> list[str]:
    return [line.split()[0] for line in (shared / "backends" / "sim" / "submissions.log").read_text().splitlines()]


async def test_sigkill_the_active_service_five_times(pair: Pair, ssh_env2: SshEnv, side: Path) -> None:
    rng = random.Random(16)
    home = pair.sups[1].home
    shared = home.parent / "shared"
    api = Following(home, deadline=time.monotonic() + 180)
    await pair.active()
    jobs = (ssh_job(side, ssh_env2, rng), sim_job())
    fqids = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(pair.kill_at_random, KILLS, 1.5, 3.5, rng)
        for job in jobs:
            fqids.append(await api.add_and_submit(job.name, job.spec()))
    assert len(pair.takeovers) == KILLS
    assert max(pair.takeovers) < TAKEOVER_LIMIT, f"takeovers took {pair.takeovers} s"

    masters = await api.wait_final(fqids)
    assert [m["status"] for m in masters] == ["completed", "completed"], masters
    assert masters[0]["counts"] == {"completed": SSH_N} and masters[1]["counts"] == {"completed": SIM_N}
    ran = {i: len((side / str(i)).read_text().split()) if (side / str(i)).exists() else 0 for i in range(SSH_N)}
    assert {i: n for i, n in ran.items() if n != 1} == {}  # every ssh subjob ran exactly once
    for fqid, n in zip(fqids, (SSH_N, SIM_N), strict=True):
        rows = await stored_subjobs(home, fqid)
        assert len(rows) == n and {s for _, s, _ in rows} == {"completed"} and {c for _, _, c in rows} == {1}

    prefix = await home_key(home)
    for keys, n in ((launches(ssh_env2, shared), SSH_N), (ledger(shared), SIM_N)):
        assert duplicates(keys) == {} and len(keys) == n  # no backend saw a run twice
        assert {k.split("-")[1] for k in keys} == {prefix}  # one prefix for both homes: the repository's
        assert {k.rsplit("-", 1)[1] for k in keys} == {"1"}  # each the first attempt
