"""A run started by the job wrapper, killed, when the orchestrator dies before ``kill_grace`` is over
(``docs/reference.md``, ``kill_grace`` and "local"): the next process finds the killed wrapper by its ``KILL`` line.
A wrapper still running holds its slot against ``max_running`` until it ends, and gets its SIGKILL when due, as
does what is left of the group of one that ended (a child that ignores SIGTERM); the run ends ``killed``, reported
so to a core that still had it active.

Before, the SIGKILL was only a live orchestrator's to send: a killed program that ignored SIGTERM ran on for good
(or until it ended by itself), beside the next process's runs and outside its ``max_running``; and a run whose kill
the core had not yet written when the process died was failed, then retried, as a crash."""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
from orch_local import LocalDriver
from test_glite import group_alive
from test_local import alive
from test_local_launcher_restart import what_the_next_driver_reports

from orchestrator import Executable, Job, Orchestrator
from orchestrator.plugin import DriverContext, JobStatus, RunHandle, RunSpec, StatusUpdate

pytestmark = pytest.mark.anyio

KILL_WRAPPED_THEN_CRASH = '''
import anyio, os, signal, sys, time
from orchestrator import Backend, Executable, Job, Orchestrator

async def main(home, script, grace):
    config = {"backends": {"local": {"kill_grace": float(grace), "max_running": 1}}}
    async with Orchestrator(home=home, config=config) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]),
                                    backend=Backend("local", shell="/bin/sh")))
        await j.submit()
        with anyio.fail_after(20):  # running, its SIGTERM ignored from now on
            while j.status != "running" or not (j.outputdir / "stdout").read_text():
                await anyio.sleep(0.02)
        wrapper = (j.outputdir / "orch.1.log").read_text().split()[2]  # its process group's leader
        print(wrapper, time.time(), flush=True)
        await j.kill()
        os.kill(os.getpid(), signal.SIGKILL)  # before kill_grace: no SIGKILL will come from here

anyio.run(main, *sys.argv[1:])
'''


def kill_then_crash(home: Path, script: str, grace: float) -> tuple[int, float]:
    """A wrapped run of ``script``, killed by an orchestrator that dies at once: its wrapper's pid, and the time of
    the kill."""
    proc = subprocess.run([sys.executable, "-c", KILL_WRAPPED_THEN_CRASH, str(home), script, str(grace)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    wrapper, killed_at = proc.stdout.split()
    return int(wrapper), float(killed_at)


async def test_a_killed_wrapper_left_running_holds_its_slot_and_gets_its_sigkill_from_the_next_process(
        tmp_path: Path) -> None:
    """The program ignores SIGTERM, and the orchestrator that killed it died before ``kill_grace`` (8 s) was over.
    The next one, at ``max_running`` 1, starts nothing while the killed wrapper runs, and SIGKILLs its group when
    the grace is over: not at once, and not after the 60 s of its sleep."""
    home, side = tmp_path / "home", tmp_path / "side"
    wrapper, killed_at = kill_then_crash(home, "trap '' TERM; echo up; sleep 60", 8.0)
    try:
        assert alive(wrapper)
        async with Orchestrator(home=home, config={"backends": {"local": {"max_running": 1}}}) as orch:
            after = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", f"echo ran >> {side}"]),
                                            backend="local"))
            await after.submit()
            await anyio.sleep(0.5)
            assert alive(wrapper) and after.status == "submitted" and not side.exists()
            with anyio.fail_after(20):
                while alive(wrapper):
                    assert not side.exists(), "a run started beside the killed wrapper, past max_running"
                    await anyio.sleep(0.05)
            assert time.time() >= killed_at + 8.0 - 0.2, "SIGKILLed before kill_grace was over"
            await after.wait(timeout=30)
            assert after.status == "completed"
            assert orch.jobs[0].status == "killed"
            assert orch.jobs[0].info.submit_counter == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(wrapper, signal.SIGKILL)


async def test_what_is_left_of_a_killed_wrappers_group_gets_its_sigkill_from_the_next_process(tmp_path: Path) -> None:
    """The program ends at SIGTERM, and its wrapper with it, but a child it left in the background ignores SIGTERM.
    A live orchestrator SIGKILLs the group after ``kill_grace`` all the same; so does the next one (its ``local``
    started by a run), when the one that killed it died meanwhile."""
    wrapper, killed_at = kill_then_crash(tmp_path / "home", "(trap '' TERM; sleep 60) & echo up; sleep 60", 3.0)
    try:
        with anyio.fail_after(10):
            while alive(wrapper):
                await anyio.sleep(0.05)
        assert group_alive(wrapper), "nothing was left of the group"
        async with Orchestrator(home=tmp_path / "home") as orch:
            j = await orch.jobs.add(Job(application=Executable("/bin/true"), backend="local"))
            await j.submit()
            with anyio.fail_after(15):
                while group_alive(wrapper):
                    await anyio.sleep(0.05)
            assert time.time() >= killed_at + 3.0 - 0.2, "SIGKILLed before kill_grace was over"
            await j.wait(timeout=30)
            assert j.status == "completed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(wrapper, signal.SIGKILL)


@pytest.mark.parametrize("script", ["trap '' TERM; echo up; sleep 30", "echo up; sleep 30"],
                         ids=["ignores-sigterm", "ends-at-sigterm"])
async def test_a_wrapper_killed_by_a_driver_that_died_before_the_kill_was_on_record_ends_killed(
        tmp_path: Path, script: str) -> None:
    """The core had not written the kill when the process died: it still has the run running, and the next driver,
    asked to follow it, reports it ``killed`` once the wrapper has ended (by the SIGKILL it sends when the first
    driver's ``kill_grace`` is over, for a program that ignores SIGTERM). Before, the wrapper's end without an END
    line was reported failed, as a crash (then retried), and a program that ignored SIGTERM was never SIGKILLed.
    Through the plugin API: the first driver is dropped as a crash drops it, right after its kill."""
    home = tmp_path / "home"
    statedir = home / "backends" / "local"
    statedir.mkdir(parents=True)
    jobdir = home / "workspace" / "1" / "0"
    run = RunSpec(fqid="1.0", index=0, attempt=1, key="orch-t-1.0-1", executable="/bin/sh", args=("-c", script),
                  env={}, settings={"shell": "/bin/sh"}, inputs=(), outputfiles=(), jobdir=jobdir,
                  inputdir=jobdir / "input", outputdir=jobdir / "output", workdir=jobdir / "work")
    first_heard: list[StatusUpdate] = []

    async def first_report(updates: Sequence[StatusUpdate]) -> None:
        first_heard.extend(updates)

    first = LocalDriver(DriverContext(home=home, statedir=statedir, config={"kill_grace": 1.0}, report=first_report))
    async with anyio.create_task_group() as tg:
        tg.start_soon(first.serve)
        key = await first.submit(run)
        with anyio.fail_after(20):
            while not first_heard or not (run.outputdir / "stdout").exists() or not (
                    run.outputdir / "stdout").read_text():
                await anyio.sleep(0.02)
        assert [u.status for u in first_heard] == [JobStatus.RUNNING]
        wrapper = int((run.outputdir / "orch.1.log").read_text().split()[2])
        handle = RunHandle(run.fqid, run.index, key, run.settings, run.outputdir, status=JobStatus.RUNNING, key=key,
                           attempt=1, jobdir=jobdir)
        killed_at = time.time()
        await first.kill(handle)
        tg.cancel_scope.cancel()
    try:
        stubborn = script.startswith("trap")
        with anyio.fail_after(10):  # the next driver finds it running (ignores SIGTERM), or gone
            while alive(wrapper) != stubborn:
                await anyio.sleep(0.02)
        # reported within 10 s: the first driver's 1 s grace, not the 30 s of the sleep
        reports, first_at = await what_the_next_driver_reports(home, handle, settle=0.3)
        assert [(u.fqid, u.status) for u in reports] == [("1.0", JobStatus.KILLED)]
        assert not stubborn or first_at >= killed_at + 1.0 - 0.1, "SIGKILLed before kill_grace was over"
        assert not alive(wrapper)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(wrapper, signal.SIGKILL)


async def test_a_run_file_in_an_owners_job_dir_is_never_run_as_the_orchestrators_user(tmp_path: Path) -> None:
    """A run accepted but neither noted in ``submitted.log`` nor launched when the process died is started by
    the next from the run file an earlier version of the driver left in its job dir, which the wrapper sources.
    In a team service that dir is its owner's, who could have put a ``run.env`` of their own there (an earlier
    attempt's program can): it ran as the service's user, root. Only a file of the orchestrator's own user, in a
    dir of its own, is taken; the run is failed as lost instead."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the job dir is another user's")
    nobody = pwd.getpwnam("nobody")
    home, marker = tmp_path / "home", tmp_path / "ran-as-root"
    statedir = home / "backends" / "local"
    statedir.mkdir(parents=True)
    top = home / "workspace" / "1"
    jobdir = top / "0"
    jobdir.mkdir(parents=True)
    key = "orch-t-1.0-2"
    (jobdir / "run.env").write_text(f"ORCH_KEY={key}\ntouch {marker}\n")
    for path in (top, jobdir, jobdir / "run.env"):
        os.chown(path, nobody.pw_uid, nobody.pw_gid)
    handle = RunHandle("1.0", 0, key, {}, jobdir / "output", key=key, attempt=2, jobdir=jobdir, owner="nobody")
    reports, _ = await what_the_next_driver_reports(home, handle, settle=1.0)  # a wrapper from the file: run by then
    assert [(u.fqid, u.status, u.reason) for u in reports] == [
        ("1.0", JobStatus.FAILED, "lost: no record of the run and no launch")]
    assert not marker.exists()
