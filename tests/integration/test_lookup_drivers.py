"""``Driver.lookup`` of the ssh, slurm and glite drivers, against their real backends.

After a crash the core asks a *fresh* driver, by ``RunSpec.key``, whether
each run it was submitting reached the backend: the answer must be the very
id ``submit_bulk`` returned (so status and kill work on it), ``None`` for a
run that never got there, and a submission still under way when the
orchestrator died must never start a run the core was told it may send
again. Each test submits with one driver instance, drops it as a crash
would, and asks a new one over the same state dir (and the same backend).
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import orch_glite
import pytest
from orch_glite import GliteDriver
from orch_glite.protocol import WMSUnavailable, call
from orch_glite.testing import WMSProcess
from orch_slurm import SlurmDriver
from orch_slurm.slurm import LocalRunner, Result, SlurmError, batch_script
from orch_ssh import SshDriver
from orch_ssh.host import Dropped, Host
from slurmd import SlurmCluster, slurm_cluster  # noqa: F401 - the session fixture, used by name
from sshd import SshEnv

from orchestrator.plugin import Driver, DriverContext, JobStatus, RunHandle, RunSpec, StatusUpdate
from orchestrator.plugin.wrapper import read_log

pytestmark = pytest.mark.anyio
S = JobStatus
FINAL = (S.COMPLETED, S.FAILED, S.KILLED, S.HELD)


class Crash(Exception):
    """The orchestrator process dies here (what a SIGKILL does to the driver's bookkeeping)."""


def context(home: Path, name: str) -> DriverContext:
    statedir = home / "backends" / name
    statedir.mkdir(parents=True, exist_ok=True)
    return DriverContext(home=home, statedir=statedir)


def spec(tmp_path: Path, i: int, settings: Mapping[str, Any], script: str,
         env: Mapping[str, str] | None = None) -> RunSpec:
    """Run ``i`` of job 1: ``sh -c script i``."""
    jobdir = tmp_path / "ws" / "1" / str(i)
    for sub in ("input", "output", "work"):
        (jobdir / sub).mkdir(parents=True, exist_ok=True)
    return RunSpec(fqid=f"1.{i}", index=i, attempt=1, key=f"orch-lk-1.{i}-1", executable="/bin/sh",
                   args=("-c", script, str(i)), env=dict(env or {}), settings=dict(settings), inputs=(), outputfiles=(),
                   jobdir=jobdir, inputdir=jobdir / "input", outputdir=jobdir / "output", workdir=jobdir / "work")


def never_sent(run: RunSpec) -> RunSpec:
    return dataclasses.replace(run, fqid="1.99", key="orch-lk-1.99-1")


def handles(runs: Sequence[RunSpec], ids: Sequence[str | None]) -> list[RunHandle]:
    return [RunHandle(r.fqid, r.index, str(i), r.settings, r.outputdir) for r, i in zip(runs, ids, strict=True)]


async def until_final(driver: Driver, watched: list[RunHandle], timeout: float = 60) -> dict[str, StatusUpdate]:
    """Poll ``status_bulk`` like the core until every run ended."""
    final: dict[str, StatusUpdate] = {}
    with anyio.fail_after(timeout):
        while len(final) < len(watched):
            for u in await driver.status_bulk([h for h in watched if h.fqid not in final]):
                if u.status in FINAL:
                    final[u.fqid] = u
            await anyio.sleep(0.2)
    return final


def runs_of(side: Path, i: int) -> int:
    """How many times run ``i`` ran (each appends a line to its side file)."""
    f = side / str(i)
    return len(f.read_text().split()) if f.exists() else 0


# ======================================================================= ssh
async def test_ssh_fresh_driver_finds_started_and_queued_runs_by_key(ssh_env2: SshEnv, side: Path,
                                                                     tmp_path: Path) -> None:
    settings = SshDriver.validate_settings(ssh_env2.settings(hosts=ssh_env2.hosts[:1], slots=2))
    runs = [spec(tmp_path, i, settings, f'echo x >> {side}/"$0"; echo "out $0"') for i in range(3)]
    first = SshDriver(context(tmp_path / "home", "ssh"))
    ids = [o.backend_id for o in await first.submit_bulk(runs)]  # two started, one prepared and queued
    await first.aclose()  # "crash": its launcher never starts the queued run
    again = SshDriver(context(tmp_path / "home", "ssh"))
    assert await again.lookup([*runs, never_sent(runs[0])]) == [*ids, None]
    assert again.calls["lookup"] == 1  # one command per host, whatever the number of keys
    async with anyio.create_task_group() as tg:  # the adopted runs are watched, the queued one started
        tg.start_soon(again.serve)
        final = await until_final(again, handles(runs, ids))
        tg.cancel_scope.cancel()
    assert {u.status for u in final.values()} == {S.COMPLETED}
    assert [(r.outputdir / "stdout").read_text() for r in runs] == [f"out {i}\n" for i in range(3)]
    assert [runs_of(side, i) for i in range(3)] == [1, 1, 1]
    await again.aclose()


async def test_ssh_submission_under_way_is_fenced_then_sent_again_once(ssh_env2: SshEnv, side: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The start command reaches a host only after the lookup said "not there": it starts nothing."""
    real = Host.command
    late: dict[str, Any] = {}

    async def delayed(self: Host, kind: str, script: str, tally: dict[str, int] | None = None,
                      timeout: float | None = None) -> bytes:
        if kind == "submit" and not late:
            late.update(host=self, script=script)
            raise Dropped("injected: the orchestrator died while its start command was on its way")
        out: bytes = await real(self, kind, script, tally, timeout=timeout)
        return out

    monkeypatch.setattr(Host, "command", delayed)
    settings = SshDriver.validate_settings(ssh_env2.settings(slots=4))
    run = spec(tmp_path, 0, settings, f'echo x >> {side}/"$0"; echo "out $0"')
    first = SshDriver(context(tmp_path / "home", "ssh"))
    await first.submit_bulk([run])
    await first.aclose()
    again = SshDriver(context(tmp_path / "home", "ssh"))
    assert await again.lookup([run]) == [None]  # on neither host, and fenced on both
    host: Host = late["host"]  # the connection the start command was on its way through (it reconnects)
    said = (await real(host, "submit", late["script"])).decode().splitlines()
    assert f"D {run.key}" in said and f"P {run.key}" not in said and "OK" in said  # neither prepared nor started
    [outcome] = await again.submit_bulk([run])  # the core sends it again under the same key
    assert outcome.ok
    final = await until_final(again, handles([run], [outcome.backend_id]))
    assert final[run.fqid].status == S.COMPLETED and (run.outputdir / "stdout").read_text() == "out 0\n"
    said = (await real(host, "submit", late["script"])).decode().splitlines()
    assert f"D {run.key}" in said  # still nothing, whichever host the run went to
    await anyio.sleep(0.5)
    assert runs_of(side, 0) == 1
    assert await again.lookup([run]) == [outcome.backend_id]
    await again.aclose()
    await host.aclose()


# ===================================================================== slurm
def slurm_runs(tmp_path: Path, cluster: SlurmCluster, n: int, side: Path) -> list[RunSpec]:
    side.mkdir(exist_ok=True)
    settings = SlurmDriver.validate_settings({"slurm_conf": str(cluster.conf)})
    return [spec(tmp_path, i, settings, f'echo x >> {side}/"$0"; echo "out $0"') for i in range(n)]


class SbatchThenCrash:
    """Runs every command; once ``sbatch`` answered, the process "dies" before it reads the answer."""

    def __init__(self) -> None:
        self.real = LocalRunner()
        self.jobs: list[str] = []

    async def __call__(self, argv: Sequence[str], *, stdin: bytes | None, env: Mapping[str, str] | None,
                       timeout: float) -> Result:
        res = await self.real(argv, stdin=stdin, env=env, timeout=timeout)
        if argv[0] == "sbatch":
            self.jobs.append(res.out.strip())
            raise Crash("died before reading sbatch's answer")
        return res


class SbatchInFlight:
    """``sbatch`` leaves, but reaches the controller only later (kept here for the test to send)."""

    def __init__(self) -> None:
        self.sent: list[tuple[list[str], bytes | None, Mapping[str, str] | None]] = []

    async def __call__(self, argv: Sequence[str], *, stdin: bytes | None, env: Mapping[str, str] | None,
                       timeout: float) -> Result:
        if argv[0] == "sbatch":
            self.sent.append((list(argv), stdin, env))
            raise Crash("died while sbatch was on its way")
        return await LocalRunner()(argv, stdin=stdin, env=env, timeout=timeout)


async def test_slurm_fresh_driver_finds_arrays_and_lone_jobs_by_key(slurm_cluster: SlurmCluster,  # noqa: F811
                                                                    tmp_path: Path) -> None:
    runs = slurm_runs(tmp_path, slurm_cluster, 4, tmp_path / "side")
    first = SlurmDriver(context(tmp_path / "home", "slurm"))
    ids = [o.backend_id for o in await first.submit_bulk(runs[:3])] + [await first.submit(runs[3])]
    assert ids[0] is not None and ids[0].endswith("_0") and "_" not in str(ids[3])
    again = SlurmDriver(context(tmp_path / "home", "slurm"))
    assert await again.lookup([*runs, never_sent(runs[0])]) == [*ids, None]
    final = await until_final(again, handles(runs, ids))
    assert {u.status for u in final.values()} == {S.COMPLETED}


async def test_slurm_sbatch_answered_but_never_recorded_is_found(slurm_cluster: SlurmCluster,  # noqa: F811
                                                                 tmp_path: Path) -> None:
    side = tmp_path / "side"
    runs = slurm_runs(tmp_path, slurm_cluster, 3, side)
    first = SlurmDriver(context(tmp_path / "home", "slurm"))
    first.runner = crashing = SbatchThenCrash()
    with pytest.raises(Crash):
        await first.submit_bulk(runs)
    [job] = crashing.jobs
    again = SlurmDriver(context(tmp_path / "home", "slurm"))
    ids = await again.lookup(runs)
    assert ids == [f"{job}_{i}" for i in range(3)]  # what submit_bulk would have returned
    assert again.calls["squeue"] == 1 and again.calls["sbatch"] == 0
    final = await until_final(again, handles(runs, ids))
    assert {u.status for u in final.values()} == {S.COMPLETED}
    assert [runs_of(side, i) for i in range(3)] == [1, 1, 1]
    assert await SlurmDriver(context(tmp_path / "home", "slurm")).lookup(runs) == ids  # now from the journal


async def test_slurm_sbatch_landing_after_the_lookup_is_voided(slurm_cluster: SlurmCluster,  # noqa: F811
                                                               tmp_path: Path) -> None:
    side = tmp_path / "side"
    [run] = slurm_runs(tmp_path, slurm_cluster, 1, side)
    first = SlurmDriver(context(tmp_path / "home", "slurm"))
    first.runner = in_flight = SbatchInFlight()
    with pytest.raises(Crash):
        await first.submit_bulk([run])
    again = SlurmDriver(context(tmp_path / "home", "slurm"))
    assert await again.lookup([run]) == [None]
    assert again.calls["squeue"] == 1 and again.calls["sacct"] == 1
    [(argv, stdin, env)] = in_flight.sent
    landed = await LocalRunner()(argv, stdin=stdin, env=env, timeout=30)  # the old sbatch reaches Slurm now
    late = landed.out.strip()
    with anyio.fail_after(60):
        while "COMPLETED" not in (await LocalRunner()(["squeue", "-h", "--states=all", "-j", late, "-o", "%T"],
                                                      stdin=None, env=env, timeout=30)).out:
            await anyio.sleep(0.3)
    assert read_log(run.outputdir).started is None and runs_of(side, 0) == 0  # it ended without running the run
    [outcome] = await again.submit_bulk([run])  # sent again under its key: a new sbatch, with a name of its own
    assert outcome.ok and outcome.backend_id != late
    sbatch = next(a for a in reversed(again.history) if a[0] == "sbatch")
    assert f"--job-name={run.key}" not in sbatch and any(a.startswith(f"--job-name={run.key}+") for a in sbatch)
    final = await until_final(again, handles([run], [outcome.backend_id]))
    assert final[run.fqid].status == S.COMPLETED and runs_of(side, 0) == 1
    assert await SlurmDriver(context(tmp_path / "home", "slurm")).lookup([run]) == [outcome.backend_id]


class Scripted:
    """A fake Slurm answering each command by name (for what a test cluster cannot show on demand)."""

    def __init__(self, answers: dict[str, Result]) -> None:
        self.answers = answers
        self.seen: list[list[str]] = []

    async def __call__(self, argv: Sequence[str], *, stdin: bytes | None, env: Mapping[str, str] | None,
                       timeout: float) -> Result:
        self.seen.append(list(argv))
        return self.answers[argv[0]]


async def test_slurm_ended_array_is_found_in_the_completion_log(tmp_path: Path) -> None:
    """Aged out of squeue: ``sacct -c`` lists the array's tasks by their own ids; the array's is the lowest."""
    runs = [spec(tmp_path, i, {}, "true") for i in range(3)]
    driver = SlurmDriver(context(tmp_path / "home", "slurm"))
    name = "orch-array-0123456789abcdef-3"
    driver.journal.intent(name, [r.key for r in runs])
    driver.runner = fake = Scripted({"squeue": Result(0, "", ""), "sacct": Result(
        0, f"12|{name}|{driver.context.statedir}\n10|{name}|{driver.context.statedir}\n11|{name}|\n9|other|\n"
           f"8|{name}|/elsewhere\n", "sacct: error: Unknown type ArrayJobId: 10\n")})
    assert await driver.lookup([*runs, never_sent(runs[0])]) == ["10_0", "10_1", "10_2", None]
    assert [a[0] for a in fake.seen] == ["squeue", "sacct"]
    assert not list(driver.journal.fences.iterdir())  # the hold was taken down: the job may run
    fake.answers["squeue"] = Result(1, "", "slurm_load_jobs error: Unable to contact slurm controller")
    other = SlurmDriver(context(tmp_path / "other", "slurm"))
    other.journal.intent("orch-lk-1.0-1", [runs[0].key])
    other.runner = fake
    with pytest.raises(SlurmError, match="squeue exited"):  # cannot be asked: the core asks again later
        await other.lookup(runs[:1])
    assert not list(other.journal.fences.iterdir())  # released, not voided: the next lookup may still find it


def test_fenced_batch_script_waits_on_the_hold_and_ends_on_the_void(tmp_path: Path) -> None:
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text('echo "wrapped $1"\n')
    (tmp_path / "run").mkdir()
    fence = tmp_path / "fences" / "name"
    fence.parent.mkdir()
    script = batch_script("/bin/sh", wrapper, [tmp_path / "run"], "run.env", fence=str(fence))
    Path(f"{fence}.hold").touch()
    proc = subprocess.Popen(["sh", "-c", script], env={"PATH": "/usr/bin:/bin"}, stderr=subprocess.PIPE)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=1.5)  # held: the task waits
    Path(f"{fence}.hold").rename(f"{fence}.void")
    assert proc.wait(timeout=5) == 0 and b"voided" in (proc.stderr.read() if proc.stderr else b"")
    assert not (tmp_path / "run" / "wrapper.out").exists()  # the wrapper never ran
    Path(f"{fence}.void").unlink()
    subprocess.run(["sh", "-c", script], env={"PATH": "/usr/bin:/bin"}, check=True)
    assert (tmp_path / "run" / "wrapper.out").read_text() == f"wrapped {tmp_path / 'run'}/run.env\n"


# ===================================================================== glite
@pytest.fixture
def wms(tmp_path: Path) -> Iterator[WMSProcess]:
    service = WMSProcess(tmp_path / "wms").start()
    try:
        yield service
    finally:
        service.stop()
        service.kill_nodes()


def glite_runs(tmp_path: Path, wms: WMSProcess, n: int) -> list[RunSpec]:
    settings = GliteDriver.validate_settings({"endpoint": wms.endpoint})
    side = tmp_path / "side"
    side.mkdir(exist_ok=True)
    return [spec(tmp_path, i, settings, 'echo x >> "$SIDE/$0"; echo "out $0"', {"SIDE": str(side)})
            for i in range(n)]


async def test_glite_fresh_driver_finds_collection_and_lone_nodes_by_key(wms: WMSProcess, tmp_path: Path) -> None:
    runs = glite_runs(tmp_path, wms, 4)
    first = GliteDriver(context(tmp_path / "home", "glite"))
    ids = [o.backend_id for o in await first.submit_bulk(runs[:3])] + [await first.submit(runs[3])]
    again = GliteDriver(context(tmp_path / "home", "glite"))
    assert await again.lookup([*runs, never_sent(runs[0])]) == [*ids, None]
    assert again.calls["lookup"] == 1
    final = await until_final(again, handles(runs, ids))
    assert {u.status for u in final.values()} == {S.COMPLETED}


async def test_glite_submission_arriving_after_the_lookup_is_voided(wms: WMSProcess, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    runs = glite_runs(tmp_path, wms, 2)
    held: list[tuple[str, str, str, Any]] = []

    async def in_flight(endpoint: str, method: str, path: str, document: Any = None, *, timeout: float = 10) -> Any:
        held.append((endpoint, method, path, document))
        raise WMSUnavailable("injected: the orchestrator died while its submission was on its way")

    monkeypatch.setattr(orch_glite, "call", in_flight)
    first = GliteDriver(context(tmp_path / "home", "glite"))
    with pytest.raises(Exception, match="collection submission failed"):
        await first.submit_bulk(runs)
    monkeypatch.setattr(orch_glite, "call", call)
    again = GliteDriver(context(tmp_path / "home", "glite"))
    assert await again.lookup(runs) == [None, None]
    endpoint, method, path, document = held[0]
    late = await call(endpoint, method, path, document)  # the old request arrives now: refused
    assert late["collection"] is None and all("voided" in e["error"] for e in late["nodes"])
    outcomes = await again.submit_bulk(runs)  # sent again under the same keys, with the lookup's epoch
    ids = [o.backend_id for o in outcomes]
    assert all(o.ok for o in outcomes)
    final = await until_final(again, handles(runs, ids))
    assert {u.status for u in final.values()} == {S.COMPLETED}
    assert [runs_of(tmp_path / "side", i) for i in range(2)] == [1, 1]
    again_late = await call(endpoint, method, path, document)  # and repeated once more: still nothing new
    assert again_late["collection"] is None
    assert await GliteDriver(context(tmp_path / "home", "glite")).lookup(runs) == ids
