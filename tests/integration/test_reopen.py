"""Reopening a home restores everything; a killed orchestrator loses nothing; one process per home."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from orchestrator import ArgSplitter, Backend, Executable, HomeLockedError, Job, Orchestrator, TextMerger

pytestmark = pytest.mark.anyio


def subjobs_in_memory(master: Job) -> int:
    """How many subjob objects of ``master`` this process holds (what a lazy list has made)."""
    return sum(1 for o in gc.get_objects() if isinstance(o, Job) and o.parent is master)


def snapshot(orch: Orchestrator) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for j in orch.jobs:
        rows.append((j.fqid, j.name, j.status.value, j.backend_id, j.info.to_dict(), j.backend.to_dict(),
                     j.parent, len(j.subjobs)))
        for s in j.subjobs:
            assert s.application is not None
            rows.append((s.fqid, s.name, s.status.value, s.backend_id, s.info.to_dict(), s.backend.to_dict(),
                         s.parent.fqid if s.parent else None, s.application.to_dict()))
    return rows


async def test_close_and_reopen_restores_everything(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        j = await orch.jobs.add(Job(name="m", application=Executable("/bin/true"),
                                    splitter=ArgSplitter([["a"], ["b"], ["c"], ["d"]]),
                                    backend=Backend("sim", run_seconds=0.01, outcome={1: "failed"}, fail_submit=[3],
                                                    bulk=False), merger=TextMerger(files=["x"], ignorefailed=True)))
        await j.submit(keep_going=True)
        await j.wait(timeout=10)
        await j.subjobs[1].resubmit()
        await j.wait(timeout=10)
        single = await orch.jobs.add(Job(name="s", application=Executable("/bin/true", env={"A": "1"}), backend="sim"))
        await orch.jobs.add(Job(name="n", application=Executable("/bin/true"), backend="sim"))
        await single.submit()
        await single.wait(timeout=10)
        before = snapshot(orch)
        assert [s.status.value for s in j.subjobs] == ["completed", "failed", "completed", "new"]
    async with Orchestrator(home=tmp_path) as orch:
        j = orch.jobs[0]
        assert subjobs_in_memory(j) == 0  # lazily built: nothing until asked
        assert j.status == "failed" and len(j.subjobs) == 4
        assert orch.jobs((0, 2)).parent is j and orch.jobs("0.2") is j.subjobs[2]
        after = snapshot(orch)
        assert after == before
        assert j.subjobs[1].info.submit_counter == 2 and j.subjobs[3].info.submit_counter == 0
        assert j.merger is not None and j.merger.params() == {"files": ["x"], "ignorefailed": True, "overwrite": False,
                                                             "compress": False}
        # The reopened jobs still work.
        await j.subjobs[3].resubmit(backend=Backend("sim", run_seconds=0.01, bulk=False))
        await j.wait(timeout=10)
        assert j.subjobs[3].status == "completed" and "fail_submit" not in j.subjobs[3].backend.settings


async def test_reopen_mid_run_carries_on_monitoring(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/true"),
                                    splitter=ArgSplitter([[str(i)] for i in range(20)]),
                                    backend=Backend("sim", run_seconds=1.0)))
        await j.submit()
        assert j.status == "submitted"
    async with Orchestrator(home=tmp_path) as orch:
        j = orch.jobs[0]
        assert j.status in ("submitted", "running")
        await j.wait(timeout=20)
        assert j.status == "completed" and all(s.status == "completed" for s in j.subjobs)


async def test_a_second_orchestrator_on_a_home_is_refused(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path):
        with pytest.raises(HomeLockedError, match=f"pid {os.getpid()}"):
            async with Orchestrator(home=tmp_path):
                pass
        code = "import anyio, sys\nfrom orchestrator import Orchestrator\n" \
               "async def main():\n    async with Orchestrator(home=sys.argv[1]): pass\nanyio.run(main)\n"
        result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True)
        assert result.returncode != 0 and "HomeLockedError" in result.stderr and str(os.getpid()) in result.stderr
    async with Orchestrator(home=tmp_path):  # released on close
        pass


async def test_many_subjobs_reopen_lazily(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/true"),
                                    splitter=ArgSplitter([[str(i)] for i in range(3000)]),
                                    backend=Backend("sim", run_seconds=0)))
        await j.submit()
        await j.wait(timeout=30)
    async with Orchestrator(home=tmp_path) as orch:
        j = orch.jobs[0]
        assert j.status == "completed" and len(j.subjobs.select(status="completed")) == 3000
        assert subjobs_in_memory(j) == 0  # counted from the counters: no subjob object made
        last = j.subjobs[2999]
        assert last.application.args == ["2999"] and subjobs_in_memory(j) == 1


KILLED_MID_RUN = textwrap.dedent("""
    import anyio, os, signal, sys
    from orchestrator import Orchestrator, Job, Executable, ArgSplitter

    async def main():
        async with Orchestrator(home=sys.argv[1]) as orch:
            script = 'sleep "$0"; echo "done $0" >> ../../../../runs.txt; echo "out $0"'
            j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]),
                                        splitter=ArgSplitter([["-c", script, s] for s in ("0", "2", "2", "3")]),
                                        backend="local"))
            await j.submit()
            await anyio.sleep(1.0)   # subjob 0 has ended, the others are running
            print("ready", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    anyio.run(main)
""")


async def test_local_run_survives_the_orchestrator_being_killed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = subprocess.run([sys.executable, "-c", KILLED_MID_RUN, str(home)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL and "ready" in proc.stdout, proc.stderr
    async with Orchestrator(home=home) as orch:
        j = orch.jobs[0]
        assert len(j.subjobs) == 4
        await j.wait(timeout=30)
        assert [s.status.value for s in j.subjobs] == ["completed"] * 4
        for i, arg in enumerate(("0", "2", "2", "3")):
            assert (j.subjobs[i].outputdir / "stdout").read_text() == f"out {arg}\n"
    runs = (home / "runs.txt").read_text().splitlines()
    assert sorted(runs) == ["done 0", "done 2", "done 2", "done 3"]  # each ran exactly once


async def test_reopened_local_job_that_died_while_nobody_watched_is_failed(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sleep", args=["30"]), backend="local"))
        await j.submit()
        with anyio.fail_after(10):
            while j.status != "running":
                await anyio.sleep(0.05)
        pid = int((j.outputdir / "orch.1.log").read_text().split()[2])  # "<time> START <pid>" in the attempt's log
    os.killpg(pid, signal.SIGKILL)
    async with Orchestrator(home=tmp_path) as orch:
        j = orch.jobs[0]
        await j.wait(timeout=10)
        assert j.status == "failed" and "END" in (j.info.reason or "")


KILLED_BEFORE_THE_MERGE = textwrap.dedent("""
    import anyio, os, signal, sys
    from orchestrator import Orchestrator, Job, Executable, ArgSplitter, TextMerger
    from orchestrator.core.events import StatusChanged

    async def main():
        async with Orchestrator(home=sys.argv[1]) as orch:
            script = 'head -c 30000000 /dev/zero; echo "$0"'  # outputs big enough that merging them takes a while
            j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]),
                                        splitter=ArgSplitter([["-c", script, w] for w in "ab"]),
                                        merger=TextMerger(files=["stdout"]), backend="local"))

            async def crash_when_it_ends():
                async for ev in orch.events():
                    if isinstance(ev, StatusChanged) and ev.ids == ((j.id,),) and ev.new == "completed":
                        merged = (j.outputdir / "stdout").exists()
                        print("merged" if merged else "not merged", flush=True)
                        os.kill(os.getpid(), signal.SIGKILL)  # the master ended; its merger has not run

            async with anyio.create_task_group() as tg:
                tg.start_soon(crash_when_it_ends)
                await anyio.sleep(0.05)
                await j.submit()
                await anyio.sleep(60)

    anyio.run(main)
""")


async def test_a_master_that_ended_while_closed_is_merged_on_reopen(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = subprocess.run([sys.executable, "-c", KILLED_BEFORE_THE_MERGE, str(home)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL and proc.stdout.strip() == "not merged", proc.stderr
    async with Orchestrator(home=home) as orch:
        j = orch.jobs[0]
        await j.wait(timeout=30)
        assert j.status == "completed"
        merged = (j.outputdir / "stdout").read_bytes()
        assert merged == b"".join((s.outputdir / "stdout").read_bytes() for s in j.subjobs) and merged.endswith(b"b\n")


async def test_a_reopened_master_reads_its_splitter_when_it_is_used(tmp_path: Path) -> None:
    """A reopened home holds a master's splitter by name only (its arguments are read when used): the split at
    submit, ``job.splitter``, ``copy()`` and a stored change of the definition all see the whole splitter."""
    home = tmp_path / "home"
    args = [[str(i), "x" * 10] for i in range(300)]
    async with Orchestrator(home) as orch:
        await orch.jobs.add(Job(name="later", application=Executable("/bin/true"), splitter=ArgSplitter(args),
                                backend=Backend("sim", run_seconds=0)))
    async with Orchestrator(home) as orch:
        job = orch.jobs[0]
        job.comment = "the definition is written again"  # a stored change with the splitter left out in memory
    async with Orchestrator(home) as orch:
        job = orch.jobs[0]
        assert job.comment == "the definition is written again"
        await job.submit()  # split after reopening: the stored arguments, all of them
        await job.wait(timeout=60)
        assert len(job.subjobs) == 300 and job.status == "completed"
        assert [list(s.application.args) for s in job.subjobs.build(range(0, 300, 100))] == [args[0], args[100],
                                                                                             args[200]]
        twin = await job.copy()
        assert isinstance(twin.splitter, ArgSplitter) and twin.splitter.args == args
    async with Orchestrator(home) as orch:
        assert orch.jobs[0].splitter.args == args and orch.jobs[1].splitter.args == args


async def test_a_home_whose_holder_died_opens_once_the_child_it_forked_lets_go(tmp_path: Path) -> None:
    """An orchestrator SIGKILLed while a run it started had been forked but not exec'd yet (on a busy machine a
    spawned child waits for a CPU before its exec) leaves the home's lock with that child for a moment: the next
    orchestrator waits for it instead of refusing the home as in use by a process that is gone."""
    holder = textwrap.dedent(f"""
        import os, signal, time, anyio
        from orchestrator import Orchestrator

        async def main():
            async with Orchestrator(home={str(tmp_path)!r}, service=False):
                if os.fork() == 0:  # the child keeps the lock's file, as one between its fork and its exec does
                    os.closerange(0, 3)  # not the test's pipes, though
                    time.sleep(3)
                    os._exit(0)
                print("holding", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        anyio.run(main)
    """)
    died = subprocess.run([sys.executable, "-c", holder], capture_output=True, text=True, timeout=60)
    assert died.returncode == -signal.SIGKILL and "holding" in died.stdout, died.stderr
    async with Orchestrator(home=tmp_path, service=False) as orch:  # refused at once before
        assert list(orch.jobs) == []


async def test_a_big_masters_runs_written_a_few_at_a_time_reopen_as_they_were(tmp_path: Path) -> None:
    """The runs of a big master change a few at a time, over many flushes, each of which writes only the changed
    runs' part of the stored arrays; reopened, every status, attempt and time is the one the running home had."""
    n = 1200
    queued = {i: round(0.002 * i, 3) for i in range(n)}  # ends spread over 2.4 s: a few dozen runs per flush
    outcome = {i: ["failed", "completed"] for i in range(0, n, 7)}  # every 7th run is retried once
    config = {"core": {"flush_interval": 0.05}}
    async with Orchestrator(home=tmp_path, config=config) as orch:
        j = await orch.jobs.add(Job(name="big", application=Executable("/bin/true"),
                                    splitter=ArgSplitter([[str(i)] for i in range(n)]),
                                    backend=Backend("sim", run_seconds=0.01, queued=queued, outcome=outcome)))
        await j.submit()
        await j.wait(timeout=60)
        assert len(j.subjobs.select(status="failed")) == len(outcome)
        await j.subjobs.select(status="failed").resubmit()  # their second attempts complete
        await j.wait(timeout=60)
        for s in j.subjobs.select(maxid=9):
            await s.resubmit()
        await j.wait(timeout=60)
        await j.subjobs[n - 1].resubmit()  # one run alone, far from the others, changes over several flushes
        await j.wait(timeout=60)
        before = [(s.status.value, s.info.submit_counter, s.info.timestamps) for s in j.subjobs]
    assert {status for status, _, _ in before} == {"completed"}
    assert sum(attempts for _, attempts, _ in before) == n + len(outcome) + 11
    async with Orchestrator(home=tmp_path, config=config) as orch:
        after = [(s.status.value, s.info.submit_counter, s.info.timestamps) for s in orch.jobs[j.id].subjobs]
    assert after == before
