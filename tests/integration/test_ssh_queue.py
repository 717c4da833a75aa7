"""The ``ssh`` backend's queued runs survive a slow host: runs stay the driver's until they end.

Issue "Defects found by testing as a user would", 19: while ``submit_bulk``
still waited on a slow host, the runs it had already placed on a fast host
were forgotten by a monitoring tick for another job (the core did not watch
them yet), and the launcher dropped the queued ones: they never started and
the job never ended. Two real sshds; the second is reached through a
forwarder that holds each new connection 3 s (``sshd.DelayProxy``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from sshd import DelayProxy, SshEnv, env_or_skip

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator

pytestmark = pytest.mark.anyio
FAST = {"core": {"poll_interval": 0.1}}
SLOTS = 2
#: Each execution appends "start end" (epoch seconds) to ``side/<name>``: how often it ran, and when.
SCRIPT = 's=$(date +%s.%N); sleep "$1"; echo "$s $(date +%s.%N)" >> "$2/$0"'


@pytest.fixture
def slow_second_host() -> Iterator[tuple[SshEnv, DelayProxy]]:
    env = env_or_skip(2)
    proxy = DelayProxy(env.sshds[1].port, delay=3.0).start()
    yield env, proxy
    proxy.stop()
    env.cleanup()


def timed_job(name: str, n: int, seconds: float, side: Path, backend: Backend) -> Job:
    """``n`` subjobs named ``<name><i>``, each sleeping ``seconds`` and recording when it ran."""
    args = [["-c", SCRIPT, f"{name}{i}", str(seconds), str(side)] for i in range(n)]
    return Job(name=name, application=Executable("/bin/sh"), splitter=ArgSplitter(args), backend=backend)


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of ``(start, end)`` intervals that overlap."""
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])  # an end sorts before a start
    now = top = 0
    for _, step in edges:
        now += step
        top = max(top, now)
    return top


async def test_runs_placed_while_another_host_is_slow_are_not_stranded(
        slow_second_host: tuple[SshEnv, DelayProxy], side: Path, tmp_path: Path) -> None:
    env, proxy = slow_second_host
    fast, slow = env.hosts[0], proxy.label(env.user)
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(env.known_hosts.read_text() + proxy.known_hosts_line(env.sshds[1]))
    common = {"key": str(env.client_key), "workdir": str(env.workdir), "known_hosts": str(known_hosts),
              "slots": SLOTS}
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        a = await orch.jobs.add(timed_job("A", 1, 6, side, Backend("ssh", hosts=[fast], **common)))
        await a.submit()
        with anyio.fail_after(20):
            while a.status != "running":
                await anyio.sleep(0.05)
        b = await orch.jobs.add(timed_job("B", 8, 1, side, Backend("ssh", hosts=[fast, slow], **common)))
        began = time.monotonic()
        await b.submit()  # the fast host's runs are placed at once; the slow host answers 3 s later
        assert time.monotonic() - began >= 2.5 and proxy.connections >= 1  # the slow host really was slow
        on_fast = [s for s in b.subjobs if (s.backend_id or "").endswith("@" + fast)]
        assert len(on_fast) >= SLOTS  # A holds one of the fast host's slots: some of B's runs there had to wait
        with contextlib.suppress(TimeoutError):  # (stranded runs never end: the statuses below say which)
            await b.wait(timeout=30)
            await a.wait(timeout=10)
        for job in (a, b):
            assert job.status == "completed", [(s.fqid, s.status.value, s.info.reason) for s in job.subjobs]
        hosts = {f"{job.name}{i}": (s.backend_id or "").split("@", 1)[1]
                 for job in (a, b) for i, s in enumerate(job.subjobs)}
    runs: dict[str, list[tuple[float, float]]] = {}
    for name, host in hosts.items():
        lines = (side / name).read_text().splitlines() if (side / name).exists() else []
        assert len(lines) == 1, f"{name} ran {len(lines)} times"
        start, end = (float(w) for w in lines[0].split())
        runs.setdefault(host, []).append((start, end))
    assert set(runs) == {fast, slow}
    for host, intervals in runs.items():
        assert most_at_once(intervals) <= SLOTS, (host, sorted(intervals))


async def test_a_queued_run_forced_to_an_end_is_never_started(ssh_env: SshEnv, side: Path, tmp_path: Path) -> None:
    """The core's word (``force_status(..., force=True)`` leaves the backend alone) still lets go of a run."""
    backend = Backend("ssh", **ssh_env.settings(slots=1))
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(timed_job("C", 2, 1.5, side, backend))
        await j.submit()
        with anyio.fail_after(20):
            while j.subjobs[0].status != "running":
                await anyio.sleep(0.05)
        await j.subjobs[1].force_status("failed", force=True)  # still waiting for the only slot
        await j.wait(timeout=30)
        await anyio.sleep(2.5)  # the slot is free: the launcher had its chance
        assert [s.status.value for s in j.subjobs] == ["completed", "failed"]
    assert (side / "C0").exists() and not (side / "C1").exists()
