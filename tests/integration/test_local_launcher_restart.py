"""What the next process finds of ``local``'s runs when the orchestrator died at a bad moment (``docs/reference.md``,
"local", and "Statuses at a glance"):

- with the home's launcher gone too, while a run's program runs: it waits for that program to end before it
  judges the run, as the orchestrator does when only the launcher is killed (judged at once, the run was retried
  while its first program still ran);
- right after a kill: the killed runs stay killed, a killed program that ignores SIGTERM still gets its SIGKILL
  after ``kill_grace``, and a run killed while it waited never starts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
from orch_local import LocalDriver
from test_local import alive
from test_local_launcher import parent_of

from orchestrator import Orchestrator
from orchestrator.plugin import DriverContext, JobStatus, RunHandle, RunSpec, StatusUpdate

pytestmark = pytest.mark.anyio

RUN_THEN_WAIT = '''
import anyio, sys
from orchestrator import Executable, Job, Orchestrator, RetryPolicy

async def main(home, script):
    async with Orchestrator(home=home) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]), backend="local",
                                    retry=RetryPolicy(max_early=2, max_late_unhandled=2)))
        await j.submit()
        with anyio.fail_after(20):
            while j.status != "running":  # its program's pid told (the LAUNCH line)
                await anyio.sleep(0.02)
        print((j.outputdir / "orch.1.log").read_text().split()[2], flush=True)
        await anyio.sleep(120)

anyio.run(main, sys.argv[1], sys.argv[2])
'''


async def kill_the_launcher_of(program: int) -> None:
    """SIGKILL to the launcher that started ``program``, which goes on."""
    launcher = parent_of(program)
    os.kill(launcher, signal.SIGKILL)
    with anyio.fail_after(10):
        while alive(launcher):
            await anyio.sleep(0.02)
    assert alive(program)


async def test_a_run_whose_launcher_died_with_the_orchestrator_is_judged_when_its_program_ends(
        tmp_path: Path) -> None:
    """The orchestrator is killed, then the home's launcher, while a run's program runs. The next process finds
    the program by its pid (the LAUNCH line) and its environment (the run's own log named in ``ORCH_JOBLOG``): the
    run stays ``running`` while it runs, is failed as lost once it ends (no one was left to record its exit
    code), and its retry starts only then. Its program never runs twice at once."""
    home, side, go = tmp_path / "home", tmp_path / "side", tmp_path / "go"
    script = f'echo start >> {side}; while [ ! -e {go} ]; do sleep 0.05; done; echo end >> {side}'
    proc = subprocess.Popen([sys.executable, "-c", RUN_THEN_WAIT, str(home), script], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        program = int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
    await kill_the_launcher_of(program)
    try:
        async with Orchestrator(home=home) as orch:
            j = orch.jobs[0]
            await anyio.sleep(1.5)
            assert j.status == "running" and side.read_text() == "start\n"  # waited for, not judged yet
            go.touch()
            await j.wait(timeout=30)
            assert j.status == "completed" and j.info.submit_counter == 2, j.info.history
            first = j.info.history[0]
            assert (first["level"], first["action"]) == ("worker", "retry"), first
            assert "without an END line" in first["reason"]
    finally:
        go.touch()  # no program left waiting, whatever failed
    assert side.read_text() == "start\nend\nstart\nend\n"  # one at a time


RUN_TWO_THEN_WAIT = '''
import anyio, sys
from orchestrator import ArgSplitter, Executable, Job, Orchestrator, RetryPolicy

async def main(home, script):
    async with Orchestrator(home=home, config={"backends": {"local": {"max_running": 1}}}) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh"), backend="local",
                                    splitter=ArgSplitter([["-c", script, "sh", str(i)] for i in range(2)]),
                                    retry=RetryPolicy(max_early=2, max_late_unhandled=2)))
        await j.submit()
        with anyio.fail_after(20):
            while j.subjobs[0].status != "running":
                await anyio.sleep(0.02)
        print("running", flush=True)  # the second run waits at the launcher
        await anyio.sleep(120)

anyio.run(main, sys.argv[1], sys.argv[2])
'''


async def test_a_run_the_launcher_started_while_no_orchestrator_ran_is_waited_for_after_the_launcher_dies(
        tmp_path: Path) -> None:
    """The orchestrator is killed while a run waits at the launcher; the launcher starts it once the first ends (no
    orchestrator writes its LAUNCH line), and is killed in turn while it runs. The next process finds that program
    by the pid its log's ``START`` line gives: the run is waited for, then failed as lost and retried, never run
    twice at once; the first run's end, recorded by the launcher, stands."""
    home, side = tmp_path / "home", tmp_path / "side"
    script = f'echo "start $1" >> {side}; while [ ! -e {tmp_path}/go$1 ]; do sleep 0.05; done; echo "end $1" >> {side}'
    proc = subprocess.Popen([sys.executable, "-c", RUN_TWO_THEN_WAIT, str(home), script], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "running\n"
    finally:
        proc.kill()
        proc.wait()
    try:
        (tmp_path / "go0").touch()
        log = home / "workspace" / "0" / "1" / "output" / "orch.1.log"
        with anyio.fail_after(20):  # started by the launcher alone
            while not log.exists() or len(log.read_text().split()) < 3:
                await anyio.sleep(0.02)
        program = int(log.read_text().split()[2])
        await kill_the_launcher_of(program)
        async with Orchestrator(home=home, config={"backends": {"local": {"max_running": 1}}}) as orch:
            j = orch.jobs[0]
            await anyio.sleep(1.5)
            first, second = j.subjobs
            assert first.status == "completed" and second.status == "running"
            assert side.read_text().split("\n") == ["start 0", "end 0", "start 1", ""]
            (tmp_path / "go1").touch()
            await j.wait(timeout=30)
            assert j.status == "completed" and second.info.submit_counter == 2, second.info.history
            assert "without an END line" in second.info.history[0]["reason"]
    finally:
        (tmp_path / "go0").touch()
        (tmp_path / "go1").touch()
    assert side.read_text().split("\n") == ["start 0", "end 0", "start 1", "end 1", "start 1", "end 1", ""]


KILL_THEN_CRASH = '''
import anyio, os, signal, sys
from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator

async def main(home, script, way):
    backend = Backend("local") if way == "launcher" else Backend("local", shell="/bin/sh")
    async with Orchestrator(home=home, config={"backends": {"local": {"max_running": 1}}}) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh"), backend=backend,
                                    splitter=ArgSplitter([["-c", script, "sh", str(i)] for i in range(3)])))
        await j.submit()
        with anyio.fail_after(20):
            while j.subjobs[0].status != "running":
                await anyio.sleep(0.02)
        await j.subjobs[1].kill()  # waiting its turn (first: the running one's end would free its slot)
        await j.subjobs[0].kill()  # running
        os.kill(os.getpid(), signal.SIGKILL)  # at once: what kill() answered must hold

anyio.run(main, *sys.argv[1:])
'''


@pytest.mark.parametrize("way", ["launcher", "wrapper"])
async def test_a_kill_holds_when_the_orchestrator_dies_as_soon_as_it_answered(tmp_path: Path, way: str) -> None:
    """``kill()`` answers once the runs are killed on record: an orchestrator killed the moment after finds them
    killed when it restarts, and neither runs again. (The statuses were written up to ``flush_interval`` later: the
    next process took the running one's end by SIGTERM for a crash, and retried it, and started the waiting one.)"""
    home, side = tmp_path / "home", tmp_path / "side"
    script = f'echo "start $1" >> {side}; sleep 3; echo "end $1" >> {side}'
    proc = subprocess.run([sys.executable, "-c", KILL_THEN_CRASH, str(home), script, way], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    async with Orchestrator(home=home, config={"backends": {"local": {"max_running": 1}}}) as orch:
        j = orch.jobs[0]
        await j.wait(timeout=30)
        assert [s.status for s in j.subjobs] == ["killed", "killed", "completed"]
        assert [s.info.submit_counter for s in j.subjobs] == [1, 1, 1]
    assert side.read_text().split("\n") == ["start 0", "start 2", "end 2", ""]


KILL_STUBBORN_THEN_CRASH = '''
import anyio, os, signal, sys
from orchestrator import Executable, Job, Orchestrator

async def main(home, script):
    async with Orchestrator(home=home, config={"backends": {"local": {"kill_grace": 1.0}}}) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]), backend="local"))
        await j.submit()
        with anyio.fail_after(20):
            while j.status != "running":
                await anyio.sleep(0.02)
        print((j.outputdir / "orch.1.log").read_text().split()[2], flush=True)
        await j.kill()
        os.kill(os.getpid(), signal.SIGKILL)  # before kill_grace: no SIGKILL will come from here

anyio.run(main, *sys.argv[1:])
'''


async def test_a_killed_program_that_ignores_sigterm_is_sigkilled_after_kill_grace_with_no_orchestrator_left(
        tmp_path: Path) -> None:
    """The launcher SIGTERMs a killed program's group and, ``kill_grace`` later, SIGKILLs what is left of it,
    whether an orchestrator is left to ask or not: the SIGKILL was the orchestrator's to send, and a program that
    ignored SIGTERM outlived an orchestrator killed meanwhile (for good, had it never ended by itself)."""
    script = "trap '' TERM; sleep 30"
    proc = subprocess.run([sys.executable, "-c", KILL_STUBBORN_THEN_CRASH, str(tmp_path / "home"), script],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    program = int(proc.stdout.split()[0])
    try:
        with anyio.fail_after(10):  # kill_grace (1 s) after the kill, not the 30 s of its sleep
            while alive(program):
                await anyio.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(program, signal.SIGKILL)


@pytest.mark.parametrize("shell", [None, "/bin/sh"])
async def test_a_run_killed_while_it_waited_stays_killed_for_the_next_driver(tmp_path: Path, shell: str | None) -> None:
    """A run killed while it waited its turn has its ``LOST killed before it started`` line. A process that dies
    before the core has the kill on record leaves it active there; the next driver, asked to follow it, reports it
    killed and never starts it (it started it: no INTENT line, so "never launched"; or, sent to the launcher,
    reported it failed, and the core retried it). Through the plugin API: the first driver is dropped as a crash
    drops it, with its run still queued (its loop never ran)."""
    home, side = tmp_path / "home", tmp_path / "side"
    statedir = home / "backends" / "local"
    statedir.mkdir(parents=True)
    jobdir = home / "workspace" / "1" / "0"
    settings = {"shell": shell} if shell else {}
    run = RunSpec(fqid="1.0", index=0, attempt=1, key="orch-t-1.0-1", executable="/bin/sh",
                  args=("-c", f"echo ran >> {side}"), env={}, settings=settings, inputs=(), outputfiles=(),
                  jobdir=jobdir, inputdir=jobdir / "input", outputdir=jobdir / "output", workdir=jobdir / "work")
    first = LocalDriver(DriverContext(home=home, statedir=statedir))
    key = await first.submit(run)
    handle = RunHandle(run.fqid, run.index, key, run.settings, run.outputdir, key=key, attempt=1, jobdir=jobdir)
    await first.kill(handle)  # queued: never to start
    reports, _ = await what_the_next_driver_reports(home, handle, settle=0.5)  # a start would have come by then
    assert [(u.fqid, u.status) for u in reports] == [("1.0", JobStatus.KILLED)]
    assert not side.exists()


async def what_the_next_driver_reports(home: Path, handle: RunHandle, *,
                                       settle: float) -> tuple[list[StatusUpdate], float]:
    """What a new ``local`` driver of ``home``, asked to follow ``handle`` (as after a restart), reports: its first
    report and all within ``settle`` seconds after it; and the time of the first."""
    reports: list[StatusUpdate] = []

    async def report(updates: Sequence[StatusUpdate]) -> None:
        reports.extend(updates)

    driver = LocalDriver(DriverContext(home=home, statedir=home / "backends" / "local", report=report))
    async with anyio.create_task_group() as tg:
        tg.start_soon(driver.serve)
        await driver.track([handle])
        with anyio.fail_after(10):
            while not reports:
                await anyio.sleep(0.02)
        first_at = time.time()
        await anyio.sleep(settle)
        await driver.aclose()
        tg.cancel_scope.cancel()
    return reports, first_at
