"""DESIGN.md's "Public API, second edition", row by row, embedded and through a service (``api_home``).

Look-ups by position, slice and name; ``select`` by ids, backend, application
and time; slices acting collectively; ``force_status``; ``peek``; ``comment``
and ``metadata``; the stimulus ids of monitoring's reports. The outputs a run
must leave (``fail_on_missing_output``) are in ``test_missing_output.py``.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from transports import collect_events

from orchestrator import ArgSplitter, Backend, Executable, Job, JobError, JobSlice, Orchestrator
from orchestrator.core.events import StatusChanged, StatusReport, SubmitOutcomes, SubmitRequested

pytestmark = pytest.mark.anyio

EXE = str(Path(sys.executable).with_name("orchestrator"))


def sim(name: str, n: int = 0, **settings: Any) -> Job:
    """A sim job (``n`` subjobs, or none) that ends in 0.05 s unless the settings say otherwise."""
    settings.setdefault("run_seconds", 0.05)
    return Job(name=name, application=Executable("/bin/true"),
               splitter=ArgSplitter([[str(i)] for i in range(n)]) if n else None, backend=Backend("sim", **settings))


def sh(name: str, script: str, *args: str) -> Job:
    return Job(name=name, application=Executable("/bin/sh", args=["-c", script, "sh", *args]), backend="local")


async def until(check: Any, timeout: float = 20.0) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.05)


def gone(pid: int) -> bool:
    """Has ``pid`` ended (gone, or a zombie)? It may be reaped between any two reads of it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


# --------------------------------------------------------------------------- look-ups
async def test_lookups_by_position_slice_and_name(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        first = await orch.jobs.add(sim("first"))
        a, b, c = [await orch.jobs.add(sim(n)) for n in ("a", "twin", "twin")]
        await first.remove()  # ids 1, 2, 3 are left: positions and ids now differ
        assert orch.jobs[-1] is c and orch.jobs[-3] is a
        assert orch.jobs[1] is a and orch.jobs[0:1][0] is a  # a non-negative index stays the id
        with pytest.raises(KeyError):
            orch.jobs[0]
        with pytest.raises(KeyError, match="position -4"):
            orch.jobs[-4]
        last_three = orch.jobs[-3:]
        assert isinstance(last_three, JobSlice) and list(last_three) == [a, b, c]
        assert list(orch.jobs[1:3]) == [b, c] and list(orch.jobs[:-1]) == [a, b] and list(orch.jobs[::2]) == [a, c]
        assert len(orch.jobs[5:]) == 0

        assert orch.jobs["a"] is a and orch.jobs(f"{a.id}") is a  # a string of digits is an id
        with pytest.raises(JobError, match="no job is named 'nobody'"):
            orch.jobs["nobody"]
        with pytest.raises(JobError, match=f"2 jobs are named 'twin' \\({b.id}, {c.id}\\)"):
            orch.jobs["twin"]


async def test_select_by_ids_backend_application_and_time(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        a = await orch.jobs.add(sim("a", 3))
        await anyio.sleep(0.2)
        between = dt.datetime.now()  # naive: local time
        await anyio.sleep(0.2)
        b = await orch.jobs.add(sh("b", "true"))
        c = await orch.jobs.add(sim("c"))
        assert list(orch.jobs.select(ids=range(1, 5))) == [b, c]
        assert list(orch.jobs.select(ids=[a.id, c.id], backend="sim")) == [a, c]
        assert list(orch.jobs.select(backend="local")) == [b]
        assert list(orch.jobs.select(application="Executable", name="?")) == [a, b, c]
        assert len(orch.jobs.select(application="Workflow")) == 0
        assert list(orch.jobs.select(since=between)) == [b, c]
        assert list(orch.jobs.select(until=between)) == [a]
        utc = between.astimezone(dt.UTC)  # the same moment, aware
        assert list(orch.jobs.select(since=utc)) == [b, c]
        hour = dt.timedelta(hours=1)
        assert len(orch.jobs.select(since=between + hour)) == 0 and len(orch.jobs.select(until=between + hour)) == 3
        assert list(orch.jobs.select(since=between, backend="sim", status="new")) == [c]

        await a.submit()
        await a.wait(timeout=20)
        subs = a.subjobs
        assert list(subs.select(ids=range(1, 3))) == [subs[1], subs[2]]
        assert list(subs.select(ids=[0, 2], status="completed", backend="sim", application="Executable")) == \
            [subs[0], subs[2]]
        assert len(subs.select(until=between)) == 3 and len(subs.select(since=between)) == 0  # the master's time
        with pytest.raises(JobError, match="since must be a datetime"):
            orch.jobs.select(since="yesterday")


async def test_select_minid_maxid_as_ganga(api_home: Path) -> None:
    """Ganga's ``jobs.select(minid, maxid)``: both bounds included, either open, combined with the filters."""
    async with Orchestrator(home=api_home) as orch:
        a, b, c, d = [await orch.jobs.add(sim(n, 4 if n == "a" else 0)) for n in "abcd"]
        assert list(orch.jobs.select(b.id, c.id)) == [b, c]
        assert list(orch.jobs.select(c.id)) == [c, d]
        assert list(orch.jobs.select(None, b.id)) == [a, b]
        assert list(orch.jobs.select(a.id, d.id, name="[bd]")) == [b, d]
        assert list(orch.jobs.select(a.id, c.id, ids=[c.id, d.id])) == [c]
        assert d.id is not None and len(orch.jobs.select(d.id + 1, d.id + 5)) == 0
        assert list(orch.jobs.select([a.id, d.id])) == [a, d]  # a list first: ids, as before
        await a.submit()
        await a.wait(timeout=20)
        subs = a.subjobs
        assert list(subs.select(1, 2)) == [subs[1], subs[2]]
        assert list(subs.select(2)) == [subs[2], subs[3]]
        assert list(subs.select(0, 9, status="completed")) == list(subs)
        assert len(subs.select(3, 1)) == 0
        with pytest.raises(JobError, match="maxid"):
            orch.jobs.select(1, "3")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- slices
async def test_slices_submit_wait_copy_remove_and_force_collectively(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        a, b, c = [await orch.jobs.add(sim(n, 2)) for n in "abc"]
        await orch.jobs[0:2].submit()
        await orch.jobs[0:2].wait(timeout=20)
        assert (a.status, b.status, c.status) == ("completed", "completed", "new")

        # submit refuses a job that is not new whatever keep_going says; with keep_going the others go on.
        with pytest.raises(JobError, match="cannot submit a job that is completed"):
            await orch.jobs[:].submit(keep_going=False)
        assert c.status == "new"  # stopped at a, before c
        with pytest.raises(JobError, match="cannot submit a job that is completed"):
            await orch.jobs[:].submit(keep_going=True)
        await orch.jobs[:].wait(timeout=20)
        assert c.status == "completed"

        twins = await orch.jobs[1:].copy()
        assert isinstance(twins, JobSlice) and [t.name for t in twins] == ["b", "c"]
        assert all(t.status == "new" and t.subjobs == [] and t.parent is None for t in twins)
        assert [j.id for j in orch.jobs[-2:]] == [t.id for t in twins]

        done = await twins.force_status("failed")
        assert done.acted == 2 and [t.status.value for t in twins] == ["failed", "failed"]
        assert all(t.info.history[-1]["verdict"] == "forced" for t in twins)

        slow = await orch.jobs.add(sim("slow", run_seconds=60))
        await slow.submit()
        await until(lambda: slow.status == "running")
        with pytest.raises(JobError, match="cannot remove a job that is running"):
            await orch.jobs.select(status=["failed", "running"]).remove(keep_going=True)
        assert list(orch.jobs) == [a, b, c, slow]  # the failed twins went, the running job stayed

        # force_status on a slice: keep_going=True does what it can and does not raise.
        new = await orch.jobs.add(sim("new"))
        done = await JobSlice([new, slow, a]).force_status("completed", keep_going=True)
        assert done.acted == 2 + 0  # a: every subjob already final, nothing to force
        assert new.status == slow.status == "completed" and a.status == "completed"
        await orch.jobs[:].remove()
        assert len(orch.jobs) == 0


# --------------------------------------------------------------------------- force_status
async def test_force_status_on_new_jobs_and_on_a_masters_unfinished_subjobs(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        new = await orch.jobs.add(sim("new"))
        await new.force_status("completed")
        assert new.status == "completed" and new.info.reason is None
        [entry] = new.info.history
        assert (entry["level"], entry["verdict"], entry["action"]) == ("user", "forced", "completed")
        assert entry["reason"] == "forced from new to completed by the user"
        with pytest.raises(JobError, match="force_status takes 'failed' or 'completed'"):
            await new.force_status("killed")

        # A master: subjob 0 completes, 1 fails by itself, 2 and 3 wait in the queue (active: killed first);
        # only the unfinished ones are forced.
        m = await orch.jobs.add(sim("m", 4, run_seconds=0.1, outcome={1: "failed"}, queued={2: 60, 3: 60}))
        seen: list[Any] = []
        opened = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect_events, orch, seen,
                          lambda evs: any(isinstance(e, StatusChanged) and e.forced for e in evs), opened)
            await opened.wait()
            await anyio.sleep(0.2)  # through a service: the stream's subscription is made
            await m.submit()
            await until(lambda: m.subjobs[0].status == "completed" and m.subjobs[1].status == "failed")
            assert [s.status.value for s in m.subjobs[2:]] == ["submitted", "submitted"]
            done = await m.force_status("failed")
        assert done.acted == 2
        assert [s.status.value for s in m.subjobs] == ["completed", "failed", "failed", "failed"]
        assert m.status == "failed"
        assert m.subjobs[0].info.history == [] and m.subjobs[1].info.history[0]["verdict"] != "forced"
        for sub in m.subjobs[2:]:
            [entry] = sub.info.history
            assert (entry["verdict"], entry["action"]) == ("forced", "failed"), entry
            assert "from submitted" in entry["reason"] and sub.info.reason == "forced to failed by the user"
        forced = [e for e in seen if isinstance(e, StatusChanged) and e.forced]
        assert {fq for e in forced for fq in e.ids} == {(m.id, 2), (m.id, 3)}


async def test_force_status_kills_an_active_run_first_unless_force(api_home: Path) -> None:
    script = 'echo $$ > "$1"; exec sleep 60'
    async with Orchestrator(home=api_home) as orch:
        killed = await orch.jobs.add(sh("killed", script, str(api_home / "killed.pid")))
        left = await orch.jobs.add(sh("left", script, str(api_home / "left.pid")))
        await orch.jobs[-2:].submit()
        try:  # (this wait timed out now and then under load: the message says what it saw)
            await until(lambda: (api_home / "killed.pid").exists() and (api_home / "left.pid").exists()
                        and killed.status == left.status == "running", timeout=60)
        except TimeoutError:
            raise AssertionError(f"both runs never seen running: statuses {killed.status}, {left.status}; pid files "
                                 f"{(api_home / 'killed.pid').exists()}, {(api_home / 'left.pid').exists()}; "
                                 f"{killed.info.to_dict()}; {left.info.to_dict()}") from None
        pids = [int((api_home / f"{n}.pid").read_text()) for n in ("killed", "left")]
        try:
            await killed.force_status("failed")
            await left.force_status("completed", force=True)
            assert killed.status == "failed" and left.status == "completed"
            assert killed.info.history[-1]["verdict"] == left.info.history[-1]["verdict"] == "forced"
            await until(lambda: gone(pids[0]), timeout=10)  # the backend killed it
            await anyio.sleep(0.5)
            assert not gone(pids[1])  # force=True: the backend was left alone
            assert left.status == "completed"
        finally:
            for pid in pids:
                if not gone(pid):
                    os.kill(pid, 9)


# --------------------------------------------------------------------------- peek
async def test_peek_the_whole_file_its_tail_and_the_work_dir_while_running(api_home: Path) -> None:
    go = api_home / "go"
    script = ('seq 1 5; echo oops >&2; echo half > progress.txt; '
              'while [ ! -e "$1" ]; do sleep 0.05; done; echo done > progress.txt; echo 6')
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sh("peeked", script, str(go)))
        await j.submit()
        await until(lambda: j.status == "running" and (j.workspace / "work" / "progress.txt").exists())
        assert await j.peek("progress.txt") == "half\n"  # the work dir, while it runs
        assert await j.peek() == "1\n2\n3\n4\n5\n" and await j.peek(tail=2) == "4\n5\n"
        go.touch()
        await j.wait(timeout=20)
        assert j.status == "completed"
        assert await j.peek() == "1\n2\n3\n4\n5\n6\n"
        assert await j.peek("stdout", tail=3) == "4\n5\n6\n" and await j.peek(tail=0) == ""
        assert await j.peek("stderr") == "oops\n"
        with pytest.raises(JobError, match="has no file 'progress.txt'"):  # not an output file: left in work/
            await j.peek("progress.txt")
        with pytest.raises(JobError, match="field name"):
            await j.peek("../../orchestrator.toml")
        with pytest.raises(JobError, match="field tail"):
            await j.peek(tail=-1)


# --------------------------------------------------------------------------- comment and metadata
def show(home: Path, fqid: str) -> str:
    done = subprocess.run([EXE, "--home", str(home), "show", fqid], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout


async def test_comment_and_metadata_are_kept_across_reopen_and_shown(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        given = await orch.jobs.add(Job(name="given", application=Executable("/bin/true"), backend="sim",
                                        comment="calibration run", metadata={"run": 7, "tags": ["a", "b"]}))
        assigned = await orch.jobs.add(sim("assigned", 2))
        assigned.comment = "set later"
        assigned.metadata = {"energy": 13.6}
        await assigned.submit()
        await assigned.wait(timeout=20)
        with pytest.raises(JobError, match="field metadata"):
            assigned.metadata = {"bad": object()}
        ids = given.id, assigned.id
    async with Orchestrator(home=api_home) as orch:
        given, assigned = orch.jobs[ids[0]], orch.jobs[ids[1]]
        assert given.comment == "calibration run" and given.metadata == {"run": 7, "tags": ["a", "b"]}
        assert assigned.comment == "set later" and assigned.metadata == {"energy": 13.6}
        given.metadata = {**given.metadata, "checked": True}
    text = await anyio.to_thread.run_sync(show, api_home, str(ids[0]))
    assert "calibration run" in text and '{"checked": true, "run": 7, "tags": ["a", "b"]}' in text
    text = await anyio.to_thread.run_sync(show, api_home, str(ids[1]))
    assert "set later" in text and '{"energy": 13.6}' in text


# --------------------------------------------------------------------------- stimulus ids
async def test_monitoring_reports_carry_stimulus_ids_of_their_own(api_home: Path) -> None:
    def ended(evs: list[Any]) -> bool:
        return any(isinstance(e, StatusChanged) and e.new.value == "completed" for e in evs)

    seen: list[Any] = []
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim("watched", 2, run_seconds=0.3))
        opened = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect_events, orch, seen, ended, opened)
            await opened.wait()
            await anyio.sleep(0.2)
            await j.submit()
            await j.wait(timeout=20)
    [request] = [e for e in seen if isinstance(e, SubmitRequested)]
    sid = request.stimulus_id
    assert any(isinstance(e, SubmitOutcomes) and e.stimulus_id == sid for e in seen)  # the driver's answer
    reports = [e for e in seen if isinstance(e, StatusReport) and e.stimulus_id != sid]
    assert reports, "monitoring reported the runs' progress"
    report_ids = {e.stimulus_id for e in reports}
    assert sid not in report_ids
    completions = [e for e in seen if isinstance(e, StatusChanged) and e.new.value == "completed"]
    assert completions and all(e.stimulus_id in report_ids for e in completions)
