"""The ``local`` backend: the wrapper, process groups, the running cap, submission errors."""

from __future__ import annotations

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

from orchestrator import ArgSplitter, Backend, Executable, Job, JobError, Orchestrator, RetryPolicy
from orchestrator.plugin import DriverContext, RunSpec, StatusUpdate
from orchestrator.plugin.processes import ExitWatcher, reap, spawn_detached
from orchestrator.plugin.wrapper import SpawnError

pytestmark = pytest.mark.anyio


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


async def test_kill_ends_the_whole_process_group(tmp_path: Path) -> None:
    script = 'sleep 60 & echo $! > child.pid; echo started; wait'
    async with Orchestrator(home=tmp_path) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]), backend="local"))
        await j.submit()
        pidfile = j.workspace / "work" / "child.pid"
        with anyio.fail_after(10):
            while not pidfile.exists() or not pidfile.read_text().strip():
                await anyio.sleep(0.05)
        child = int(pidfile.read_text())
        assert alive(child)
        await j.kill()
        assert j.status == "killed"
        with anyio.fail_after(10):
            while alive(child):
                await anyio.sleep(0.05)
        await anyio.sleep(0.5)
        assert j.status == "killed"  # the run's ending afterwards does not override the kill
        assert any("killed" in r for r in j.info.refused) or j.info.refused == []


async def test_max_running_caps_concurrent_processes(tmp_path: Path) -> None:
    script = 'echo start >> ../../../../log; sleep 0.3; echo end >> ../../../../log'
    config = {"backends": {"local": {"max_running": 2}}, "core": {"poll_interval": 0.05}}
    async with Orchestrator(home=tmp_path, config=config) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]), backend="local",
                                    splitter=ArgSplitter([["-c", script]] * 6)))
        await j.submit()
        await j.wait(timeout=30)
        assert j.status == "completed"
    running = peak = 0
    for line in (tmp_path / "log").read_text().split():
        running += 1 if line == "start" else -1
        peak = max(peak, running)
    assert peak == 2


async def test_wrapper_environment_and_output_files(tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("input\n")
    script = ('cat data.txt > result.txt; echo "$ORCH_MODE $ORCH_RETRY_COUNT $A" > env.txt; '
              'echo "$0" > "name with space.txt"; [ -n "$ORCH_HOME" ] && [ "$(pwd)" = "$ORCH_HOME" ]')
    async with Orchestrator(home=tmp_path / "home") as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script, "it's; $(rm -rf /)"],
                                                           env={"A": "a b 'c'"}),
                                    inputfiles=[str(data)], outputfiles=["result.txt", "env.txt", "*space*"],
                                    backend="local", mode="test"))
        await j.submit()
        await j.wait(timeout=30)
        assert j.status == "completed", (j.outputdir / "stderr").read_text()
        out = j.outputdir
        assert (out / "result.txt").read_text() == "input\n"
        assert (out / "env.txt").read_text() == "test 0 a b 'c'\n"
        assert (out / "name with space.txt").read_text() == "it's; $(rm -rf /)\n"
        log = (out / "orch.log").read_text().split("\n")
        assert log[0].split()[1] == "START" and "EXIT 0" in log[-3] and "END 0" in log[-2]
        stamp = float(log[0].split()[0])
        assert abs(stamp - time.time()) < 120


async def test_a_runs_environment_is_the_orchestrators_as_it_is_when_the_run_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver keeps its environment encoded between runs; a change to ``os.environ`` is seen by the next run
    all the same, and the orchestrator's own ``ORCH_*`` values never are."""
    script = 'echo "${LOCAL_TEST_SEEN-unset} ${ORCH_OUTER-none} ${LOCAL_TEST_GONE-gone}"'
    monkeypatch.setenv("LOCAL_TEST_GONE", "here")
    async with Orchestrator(home=tmp_path / "home") as orch:
        seen = []
        for value in ("first", "second"):
            monkeypatch.setenv("LOCAL_TEST_SEEN", value)
            monkeypatch.setenv("ORCH_OUTER", "outer job's")
            j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]), backend="local"))
            await j.submit()
            await j.wait(timeout=30)
            assert j.status == "completed"
            seen.append((j.outputdir / "stdout").read_text())
            monkeypatch.delenv("LOCAL_TEST_GONE", raising=False)
    assert seen == ["first none here\n", "second none gone\n"]


async def test_missing_executable_is_refused_at_add_or_at_submit(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path / "home") as orch:
        with pytest.raises(JobError, match="does not exist.*field application.exe"):
            await orch.jobs.add(Job(application=Executable("/no/such/exe"), backend="local"))
        assert len(orch.jobs) == 0
        exe = tmp_path / "prog"
        exe.write_text("#!/bin/sh\necho hi\n")
        exe.chmod(0o755)
        j = await orch.jobs.add(Job(application=Executable(str(exe)), backend="local"))
        exe.unlink()  # gone between add and submit
        with pytest.raises(JobError, match="does not exist"):
            await j.submit()
        assert j.status == "new"


async def test_nonzero_exit_is_failed_with_the_code(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", "exit 3"]), backend="local"))
        await j.submit()
        await j.wait(timeout=30)
        assert j.status == "failed" and j.info.reason == "exit code 3 without a terminal keyword"
        assert j.info.history[-1]["level"] == "application" and j.info.history[-1]["exit_code"] == 3


async def test_unstartable_shell_fails_the_run(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("local", shell="/no/sh")))
        await j.submit()
        await j.wait(timeout=30)
        assert j.status == "failed" and "could not start the wrapper" in (j.info.reason or "")
        assert not (j.outputdir / "orch.log").exists()


async def test_a_wrapper_that_never_starts_is_noticed_after_start_timeout(tmp_path: Path) -> None:
    """``[backends.local] start_timeout``: a "shell" that exits at once never runs the wrapper (no START)."""
    config = {"core": {"poll_interval": 0.05}, "backends": {"local": {"start_timeout": 0.5}}}
    async with Orchestrator(home=tmp_path, config=config) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("local", shell="/bin/true"),
                                    retry=RetryPolicy(max_early=0)))
        await j.submit()
        await j.wait(timeout=5)  # the default (15 s) would outlast this
        assert j.status == "failed" and "never started" in (j.info.reason or "")
        assert j.info.history[-1]["level"] == "batch"  # no log at all: the batch level


async def test_resubmit_clears_the_previous_output(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        marker = tmp_path / "second"
        script = f'if [ -e {marker} ]; then echo second; else echo first; touch {marker}; exit 1; fi'
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]), backend="local"))
        await j.submit()
        await j.wait(timeout=30)
        assert j.status == "failed" and (j.outputdir / "stdout").read_text() == "first\n"
        await j.resubmit()
        await j.wait(timeout=30)
        assert j.status == "completed" and (j.outputdir / "stdout").read_text() == "second\n"
        assert os.path.exists(j.outputdir / "orch.log")


async def test_a_run_makes_its_dirs_and_files_and_nothing_else(tmp_path: Path) -> None:
    """No file per run before it starts (its values go in its environment), and the application does not see the
    wrapper's own variables, nor this process's ignored SIGPIPE (``yes`` ends quietly when ``head`` is done); what
    the run leaves is the documented workspace."""
    script = 'env > ../output/env.txt; yes | head -1'
    async with Orchestrator(home=tmp_path / "home") as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]), backend="local",
                                    splitter=ArgSplitter([["-c", script]] * 2)))
        await j.submit()
        await j.wait(timeout=30)
        assert j.status == "completed"
        sub = j.subjobs[1]
        assert sorted(p.name for p in sub.workspace.iterdir()) == ["output", "work"]
        assert sorted(p.name for p in sub.outputdir.iterdir()) == ["env.txt", "orch.log", "orch.usage", "stderr",
                                                                 "stdout"]
        seen = dict(line.split("=", 1) for line in (sub.outputdir / "env.txt").read_text().splitlines() if "=" in line)
        assert seen["ORCH_FQID"] == sub.fqid and seen["ORCH_ATTEMPT"] == "1" and "ORCH_LOG" in seen
        assert not {"ORCH_KEY", "ORCH_OUTDIR", "ORCH_NOTIFY", "ORCH_BIN", "ORCH_OUTPUTFILES"} & seen.keys()
        assert (sub.outputdir / "stdout").read_text() == "y\n" and (sub.outputdir / "stderr").read_text() == ""
        metrics = (await orch.metrics())["backends"]["local"]
        assert metrics["ticks"] == 0  # the driver reports its runs' news: it was never polled
        assert metrics["driver"]["launched"] == 2 and metrics["driver"]["reports"] >= 1


CRASH_AFTER_SUBMIT = '''
import anyio, os, signal, sys
from orchestrator import ArgSplitter, Executable, Job, Orchestrator

async def main(home, side):
    script = 'echo "$1" >> "$2"; sleep 0.5'
    args = [["-c", script, "sh", str(i), side] for i in range(8)]
    async with Orchestrator(home=home, config={"backends": {"local": {"max_running": 2}}}) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh"), splitter=ArgSplitter(args), backend="local"))
        await j.submit()
        with anyio.fail_after(20):
            while not os.path.exists(side):
                await anyio.sleep(0.02)
        os.kill(os.getpid(), signal.SIGKILL)  # two running, six accepted and queued

anyio.run(main, sys.argv[1], sys.argv[2])
'''


async def test_runs_queued_or_running_in_a_killed_process_are_run_once_by_the_next(tmp_path: Path) -> None:
    """SIGKILL with two runs running and six queued: the next process watches the two (not its children: a pidfd
    tells their end) and starts the six from what the first noted when it accepted them; each runs once."""
    home, side = tmp_path / "home", tmp_path / "ran"
    proc = subprocess.run([sys.executable, "-c", CRASH_AFTER_SUBMIT, str(home), str(side)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    async with Orchestrator(home=home, config={"backends": {"local": {"max_running": 2}}}) as orch:
        j = orch.jobs[0]
        await j.wait(timeout=30)
        assert j.status == "completed" and {s.info.submit_counter for s in j.subjobs} == {1}
    assert sorted(side.read_text().split()) == [str(i) for i in range(8)]


async def test_exit_watcher_tells_an_end_when_it_happens(tmp_path: Path) -> None:
    """The SDK's pieces: a detached start leads its own session; its end is told by its pidfd, the same for a
    process this one did not start; past the watcher's limit, watch() says no."""
    out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    try:
        pid = spawn_detached(["/bin/sh", "-c", "sleep 0.3"], dict(os.environ), out=out)
        other = subprocess.Popen(["/bin/sh", "-c", "sleep 0.2"])
    finally:
        os.close(out)
    assert os.getpgid(pid) == pid and os.getsid(pid) == pid
    watcher = ExitWatcher()
    assert watcher.watch(pid) and watcher.watch(other.pid) and len(watcher) == 2
    ended: list[int] = []
    with anyio.fail_after(10):
        while len(ended) < 2:
            ended += await watcher.ended()
    assert sorted(ended) == sorted([pid, other.pid]) and len(watcher) == 0
    assert reap(pid) == 0 and other.wait() == 0
    assert not ExitWatcher(limit=0).watch(os.getpid())
    watcher.close()
    with pytest.raises(anyio.ClosedResourceError):
        await watcher.ended()
    with pytest.raises(SpawnError, match="could not start the wrapper with /no/sh"):
        spawn_detached(["/no/sh"], {}, out=1)


async def test_runs_that_cannot_start_leave_the_rest_of_the_process_its_turns(tmp_path: Path) -> None:
    """One slot, and two thousand queued runs that all fail to start (their job dirs would lie under a file). Each
    failure frees the slot at once, and the driver starts a run or two on the event loop itself: between starts
    it must still give the rest of the process its turn. Its first report then comes long before the queue has
    drained, not once, at the end, with every run in it."""
    home, blocker, n = tmp_path / "home", tmp_path / "a-file", 2000
    (home / "backends" / "local").mkdir(parents=True)
    blocker.write_text("")
    reports: list[int] = []

    async def report(updates: Sequence[StatusUpdate]) -> None:
        reports.append(len(updates))

    driver = LocalDriver(DriverContext(home=home, statedir=home / "backends" / "local", config={"max_running": 1},
                                       report=report))
    for i in range(n):
        jd = blocker / str(i)
        await driver.submit(RunSpec(fqid=f"1.{i}", index=i, attempt=1, key=f"k-1.{i}-1", executable="/bin/true",
                                    args=(), env={}, settings={}, inputs=(), outputfiles=(), jobdir=jd,
                                    inputdir=jd / "input", outputdir=jd / "output", workdir=jd / "work"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(driver.serve)
        with anyio.fail_after(60):
            while sum(reports) < n:
                await anyio.sleep(0.01)
        await driver.aclose()
        tg.cancel_scope.cancel()
    assert len(reports) > 1 and reports[0] < n, reports[:5]
