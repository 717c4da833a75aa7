"""An active/standby pair: two ``orchestrator serve`` on two homes (standing for two hosts), one PostgreSQL.

The one that holds the repository's lease is active; the other answers as
the standby, says where the active one is, and the CLI and
``Orchestrator(home)`` follow it. A SIGTERMed active service gives the lease
back and the standby takes over at once. A leader frozen (SIGSTOP) past its
lease is replaced; resumed, it writes nothing (the database refuses its last
write, and not one row changes) and steps down with exit code 75.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import anyio
import asyncpg
import pytest
from pair import health, home_settings, pair_homes
from postgres import PostgresServer, postgres_unavailable
from served import ORCH, Service, cli, cli_ok, start

from orchestrator import Executable, Job, Orchestrator
from orchestrator.api.client import ServiceUnavailable

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

#: The exit code of a service that lost the lease (orchestrator.service.daemon.STEP_DOWN).
STEP_DOWN = 75
TABLES = ("meta", "jobs", "subjobs", "runs", "states", "lease")


def sim_jobfile(path: Path, n: int, run_seconds: float) -> Path:
    args = ", ".join(f'["{i}"]' for i in range(n))
    path.write_text(f'name = "pair"\n[application]\nexe = "/bin/true"\n[splitter]\ntype = "args"\nargs = [{args}]\n'
                    f'[backend]\nname = "sim"\nrun_seconds = {run_seconds}\n')
    return path


async def snapshot(url: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row of the repository, the lease's included."""
    conn = await asyncpg.connect(url)
    try:
        return {t: [tuple(r) for r in await conn.fetch(f"SELECT * FROM orchestrator.{t} ORDER BY 1, 2")]
                for t in TABLES}
    finally:
        await conn.close()


async def until_active(home: Path, timeout: float) -> float:
    """Seconds until the service on ``home`` answers as the active one."""
    started = time.monotonic()
    with anyio.fail_after(timeout):
        while (seen := await health(home)) is None or seen.get("role") != "active":
            await anyio.sleep(0.05)
    return time.monotonic() - started


def ledger(shared: Path) -> list[str]:
    """The sim backend's submissions (its state dir is in the shared directory): one key per line."""
    path = shared / "backends" / "sim" / "submissions.log"
    return [line.split()[0] for line in path.read_text().splitlines() if line.strip()]


async def test_the_standby_points_to_the_active_service_and_clients_follow(
        pg_url: str, tmp_path: Path, services: list[Service]) -> None:
    a, b, shared = pair_homes(tmp_path, pg_url)
    active = start(services, a)
    await until_active(a, 10)  # a holds the lease before b starts
    standby = start(services, b)
    with anyio.fail_after(10):  # it answers at once, and names the leader from its first look at the lease on
        while (seen := await health(b)) is None or seen.get("leader") is None:
            await anyio.sleep(0.05)
    assert seen["role"] == "standby", seen
    assert seen["leader"]["socket"] == str(active.socket) and seen["leader"]["pid"] == active.pid

    # The CLI on the standby's home goes to the active service; so does a home with no service at all.
    job = cli_ok(b, "submit", str(sim_jobfile(tmp_path / "job.toml", 3, 0.5))).strip()
    assert job == "0"
    bare = tmp_path / "c"
    bare.mkdir()
    (bare / "orchestrator.toml").write_text(home_settings(pg_url, shared))
    elsewhere = tmp_path / "d"  # no settings at all: --repository names the database
    assert "pair" in cli_ok(elsewhere, "--repository", pg_url, "jobs")
    refused = cli(elsewhere, "--repository", pg_url, "backup", str(tmp_path / "copy"))
    assert refused.returncode == 2 and "pg_dump" in refused.stderr
    async with Orchestrator(home=bare) as orch:
        assert orch.remote and orch.jobs[0].name == "pair"
        await orch.jobs[0].wait(timeout=30)
        assert orch.jobs[0].status == "completed"
        assert orch.jobs[0].outputdir == shared / "workspace" / "0" / "output"  # the shared directory's

        # SIGTERM: the active service gives the lease back, the standby takes over on its next look...
        code, _ = await anyio.to_thread.run_sync(active.terminate)
        assert code == 0
        assert await until_active(b, 5) < 3
        # ... and this session follows it: an operation that failed while no service answered works again
        with anyio.fail_after(20):
            while True:
                try:
                    added = await orch.jobs.add(Job(name="after", application=Executable("/bin/true"),
                                                    backend="sim"))
                    break
                except ServiceUnavailable:
                    await anyio.sleep(0.2)
        assert added.id == 1
    seen = await health(b)
    assert seen is not None and seen["pid"] == standby.pid and seen["jobs"] == 2
    assert json.loads(cli_ok(a, "jobs", "--json"))["jobs"][0]["status"] == "completed"  # a follows b now


async def test_a_frozen_leader_writes_nothing_and_steps_down(pg_url: str, tmp_path: Path,
                                                             services: list[Service]) -> None:
    a, b, shared = pair_homes(tmp_path, pg_url, lease_seconds=2)
    # a writes statuses only every 30 s: when it is frozen it holds changes that it has not written
    (a / "orchestrator.toml").write_text(home_settings(pg_url, shared, lease_seconds=2, core="flush_interval = 30.0"))
    leader = start(services, a)
    await until_active(a, 10)
    standby = start(services, b)
    assert cli_ok(a, "submit", str(sim_jobfile(tmp_path / "job.toml", 20, 4.0))).strip() == "0"

    os.kill(leader.pid, signal.SIGSTOP)
    try:
        assert await until_active(b, 15) < 10  # its lease (2 s) expired: the standby took over
        os.kill(standby.pid, signal.SIGSTOP)  # nothing else writes from here on
        try:
            before = await snapshot(pg_url)
            os.kill(leader.pid, signal.SIGCONT)
            code = await anyio.to_thread.run_sync(lambda: leader.proc_().wait(15))
            assert code == STEP_DOWN, leader.output()
            out = leader.output()
            assert "lost the repository's lease: stepping down" in out, out
            assert "another orchestrator took its lease over" in out, out
            assert "write refused: fencing token" in out, out  # its last write, refused by the database
            assert await snapshot(pg_url) == before  # and not one row changed
        finally:
            os.kill(standby.pid, signal.SIGCONT)
    finally:
        if leader.proc_().poll() is None:
            os.kill(leader.pid, signal.SIGCONT)

    # The new leader carries on: every run found by its key and watched to its end, none sent twice.
    done = cli(b, "wait", "0", "--timeout", "30")
    assert done.returncode == 0, done.stdout + done.stderr
    keys = ledger(shared)
    assert len(keys) == len(set(keys)) == 20
    assert len({k.split("-")[1] for k in keys}) == 1  # one key prefix, the repository's, for both homes


async def test_an_active_service_cut_off_from_its_database_steps_down(tmp_path: Path, services: list[Service]) -> None:
    """Its lease can no longer be renewed: it cannot know that it still holds it, so it stops (exit 75), and
    says why; supervisord would start it again, to wait as a standby until the database answers."""
    why = postgres_unavailable()
    if why is not None:
        pytest.skip(why)
    server = PostgresServer().start()  # its own server: this one goes away
    try:
        a, _, _ = pair_homes(tmp_path, await server.create_database(), lease_seconds=2, core="flush_interval = 30.0")
        active = start(services, a)
        await until_active(a, 10)
        await anyio.to_thread.run_sync(cli_ok, a, "submit", str(sim_jobfile(tmp_path / "job.toml", 5, 0.1)))
        await anyio.sleep(0.5)  # the runs ended: changes it holds, to be written every 30 s
    finally:
        server.stop()
    code = await anyio.to_thread.run_sync(lambda: active.proc_().wait(15))
    assert code == STEP_DOWN, active.output()
    assert "its lease could not be renewed" in active.output()


#: The leader's sessions that hold the lease row's share lock (the fence's ``FOR SHARE``) inside a transaction.
HOLDING = ("SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
           "WHERE l.relation = 'orchestrator.lease'::regclass AND l.granted AND l.mode = 'RowShareLock' "
           "AND a.application_name = 'orchestrator' AND a.xact_start IS NOT NULL")


async def test_a_leader_frozen_inside_a_transaction_is_taken_over_within_its_lease(
        pg_url: str, tmp_path: Path, services: list[Service]) -> None:
    """SIGSTOP while the leader holds a write transaction open (its share lock on the lease row would make the
    takeover wait as long as it stays frozen): the standby ends its sessions and takes over within the lease and
    a few seconds; resumed, the old leader writes nothing and exits 75."""
    lease = 2.0
    a, b, _ = pair_homes(tmp_path, pg_url, lease_seconds=lease)
    leader = start(services, a)
    await until_active(a, 10)
    standby = start(services, b)
    big = sim_jobfile(tmp_path / "big.toml", 50_000, 600.0)
    conn = await asyncpg.connect(pg_url)
    frozen_at = 0.0
    submits: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(6):  # a large submit's transactions (its COPY, its flushes): freeze the leader inside one
            submit = subprocess.Popen([str(ORCH), "--home", str(a), "submit", str(big)], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            submits.append(submit)
            with anyio.fail_after(120):
                while submit.poll() is None and not frozen_at:
                    holding = {r[0] for r in await conn.fetch(HOLDING)}
                    if holding:
                        os.kill(leader.pid, signal.SIGSTOP)
                        if holding & {r[0] for r in await conn.fetch(HOLDING)}:  # still inside it, frozen
                            frozen_at = time.monotonic()
                        else:
                            os.kill(leader.pid, signal.SIGCONT)
                    await anyio.sleep(0.002)
            if frozen_at:
                break
        assert frozen_at, "the leader was never caught inside a transaction"
        await until_active(b, lease + 15)
        took = time.monotonic() - frozen_at
        assert took < lease + 6, f"takeover {took:.1f} s after the freeze"
        seen = await health(b)
        assert seen is not None and seen["pid"] == standby.pid

        os.kill(standby.pid, signal.SIGSTOP)  # nothing else writes from here on
        try:
            before = await snapshot(pg_url)
            os.kill(leader.pid, signal.SIGCONT)
            code = await anyio.to_thread.run_sync(lambda: leader.proc_().wait(30))
            assert code == STEP_DOWN, leader.output()
            assert "lost the repository's lease: stepping down" in leader.output()
            assert await snapshot(pg_url) == before  # not one row changed
        finally:
            os.kill(standby.pid, signal.SIGCONT)
        assert "ended the sessions of the lease's expired holder" in standby.output()
    finally:
        await conn.close()
        if leader.proc_().poll() is None:
            os.kill(leader.pid, signal.SIGCONT)
        for submit in submits:
            if submit.poll() is None:
                submit.kill()
            submit.wait()
