"""``kill`` read exactly: which runs, the reply's count and errors, keep_going, runs caught mid-retry, and a
partitioned master's linked job (core.requests, core.outcomes)."""

from __future__ import annotations

from array import array

from orchestrator.core.events import KillRequested, LinkedAdded, Prepared, RetryDue, SubmitRequested
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import Reply, SendKill, SendSubmit
from orchestrator.core.statuses import JobStatus
from orchestrator.core.step import Change

from .harness import Harness, limits, only, profile, reply

S = JobStatus


def running(h: Harness, n: int = 3) -> int:
    m = h.add()
    h.submit_all(m, n)
    h.report(m, [0], S.RUNNING)
    return m


def test_killing_a_master_kills_its_active_runs_and_counts_them() -> None:
    h = Harness()
    m = running(h)
    h.report(m, [2], S.COMPLETED)
    step = h.request(KillRequested, m)
    kill = only(step, SendKill)
    assert kill == SendKill(stimulus_id=step.stimulus_id, backend="sim", runs=Runs(m, [0, 1]), native=True,
                            stop_on_failure=True, attempts=array("q", [1, 1]))
    assert not step.of(Reply)
    h.tick()
    step = h.killed(kill)
    assert step.changes[0] == Change(m, [0], S.RUNNING, S.KILLED, h.clock, kill.stimulus_id)
    assert reply(step) == Reply(stimulus_id=kill.stimulus_id, error=None, acted=2)


def test_killing_subjobs_by_name() -> None:
    h = Harness()
    m = running(h)
    h.report(m, [2], S.COMPLETED)
    step = h.request(KillRequested, (m, 1), (m, 2), (m, 0), (m, 1), keep_going=True)
    kill = only(step, SendKill)
    assert kill.runs == Runs(m, [0, 1]) and kill.stop_on_failure is False
    assert reply(h.killed(kill)).acted == 2


def test_kill_refusals() -> None:
    h = Harness()
    new = h.add(splits=False)
    r = reply(h.request(KillRequested, new))
    assert str(r.error).endswith(f"job {new}: cannot kill a job that was never submitted") and r.acted == 0
    m = running(h)
    r = reply(h.request(KillRequested, (m, 7)))
    assert str(r.error).endswith(f"job {m}.7: no such job")
    h.report(m, [1], S.HELD, verdict="cancelled")
    kill = only(h.request(KillRequested, (m, 1)), SendKill)  # a held run can be killed
    assert kill.runs == Runs(m, [1])


def test_a_refusal_after_a_kill_is_reported_with_its_answer() -> None:
    h = Harness()
    m = running(h)
    new = h.add(splits=False)
    step = h.request(KillRequested, (m, 0), (new,))
    kill = only(step, SendKill)
    assert kill.runs == Runs(m, [0])
    r = reply(h.killed(kill))
    assert str(r.error) == f"kill stopped: job {new}: cannot kill a job that was never submitted"
    assert r.acted == 1


def test_a_refusal_first_stops_the_kill_unless_keep_going() -> None:
    h = Harness()
    m = running(h)
    step = h.request(KillRequested, (m, 9), (m, 0))
    assert not step.of(SendKill)
    assert str(reply(step).error) == f"kill stopped: job {m}.9: no such job"
    step = h.request(KillRequested, (m, 9), (m, 0), keep_going=True)
    kill = only(step, SendKill)
    assert kill.runs == Runs(m, [0])
    r = reply(h.killed(kill))
    assert r.acted == 1 and r.error is None


def test_runs_caught_mid_retry_are_killed_once_they_are_out() -> None:
    h = Harness()
    m = h.add(limits=limits(early=1, unhandled=1))
    h.submit_all(m, 3)
    send = only(h.report(m, [0, 1], S.FAILED, exit_code=1), SendSubmit)
    h.outcomes(send, accepted=[], rejected=[(0, "unreachable"), (1, "unreachable")])  # both wait, submitting
    step = h.request(KillRequested, m)
    kill = only(step, SendKill)
    assert kill.runs == Runs(m, [2])
    r = reply(h.killed(kill))
    assert r.acted == 3
    step = h.post(RetryDue(stimulus_id="due", time=h.tick(5), runs=Runs(m, [0, 1])))
    step = h.outcomes(only(step, SendSubmit), accepted=[0], not_attempted=[1])
    late = only(step, SendKill)
    assert late.runs == Runs(m, [0]) and late.stimulus_id == "due"
    h.killed(late)
    assert h.status(m, 0) == S.KILLED and h.status(m, 2) == S.KILLED


def test_killing_a_partitioned_master_kills_its_running_prejob_and_waits_for_it() -> None:
    h = Harness()
    m = h.add(prejob=True, aggregator=True)
    step = h.request(SubmitRequested, m)
    h.prepared(step, m, 2)
    sid = step.stimulus_id
    h.post(LinkedAdded(stimulus_id=sid, time=h.clock, job=1, master=m, role="prejob", profile=profile(splits=False)))
    h.outcomes(only(h.post(Prepared(stimulus_id=sid, time=h.clock, job=1)), SendSubmit))
    h.report(1, None, S.RUNNING)
    step = h.request(KillRequested, m)
    kill = only(step, SendKill)
    assert kill == SendKill(stimulus_id=step.stimulus_id, backend="sim", runs=Runs(1), native=True,
                            stop_on_failure=False, attempts=array("q", [1]))
    assert not step.of(Reply)
    step = h.killed(kill)
    assert reply(step) == Reply(stimulus_id=kill.stimulus_id, error=None, acted=1)
    assert h.status(1) == S.KILLED
