"""``release`` and ``force_status`` read exactly: what moves under which stimulus, what the reply says and
counts, what the runs keep on record (core.requests)."""

from __future__ import annotations

from orchestrator.core.errors import JobError
from orchestrator.core.events import ForceStatusRequested, PrepareFailed, ReleaseRequested, RunLost, SubmitRequested
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import Reply, SendKill, SendSubmit, Unprepare, Unwatch
from orchestrator.core.statuses import JobStatus
from orchestrator.core.step import Change, Step
from orchestrator.core.table import RunTable

from .harness import Harness, limits, only, profile, reply

S = JobStatus


def held(h: Harness, n: int = 3, hold: tuple[int, ...] = (0, 2)) -> int:
    m = h.add()
    h.submit_all(m, n)
    h.report(m, list(hold), S.HELD, verdict="cancelled", reason="maintenance")
    return m


def sids(step: Step) -> set[str]:
    return {c.stimulus_id for c in step.changes} | {i.stimulus_id for i in step.instructions}


# ------------------------------------------------------------------ release
def test_releasing_a_master_resubmits_its_held_subjobs() -> None:
    h = Harness()
    m = held(h)
    h.tick()
    step = h.request(ReleaseRequested, m, retry_args=("--from", 3))
    send = only(step, SendSubmit)
    assert send.runs == Runs(m, [0, 2]) and send.start == "resume" and send.stimulus_id == step.stimulus_id
    assert step.changes[0] == Change(m, [0, 2], S.HELD, S.SUBMITTING, h.clock, step.stimulus_id)
    assert sids(step) == {step.stimulus_id}
    assert h.sm.retry_args((m, 2)) == ["--from", "3"] and h.sm.retry_args((m, 1)) == []
    assert h.sm.info((m, 0)).get("reason") is None
    step = h.outcomes(send)
    r = reply(step)
    assert r.stimulus_id == send.stimulus_id and r.error is None and r.acted == 2
    assert (h.status(m, 0), h.status(m, 2)) == (S.SUBMITTED, S.SUBMITTED)


def test_releasing_subjobs_by_name_and_twice_over() -> None:
    h = Harness()
    m = held(h)
    step = h.request(ReleaseRequested, (m, 2), m, (m, 0))
    assert only(step, SendSubmit).runs == Runs(m, [0, 2])
    assert reply(h.outcomes(only(step, SendSubmit))).acted == 2
    assert h.sm.retry_args((m, 0)) == []


def test_releasing_two_masters_counts_both() -> None:
    h = Harness()
    a = held(h)
    b = held(h, hold=(1,))
    step = h.request(ReleaseRequested, a, b)
    send = only(step, SendSubmit)
    assert send.runs == Runs(a, [0, 2])
    step = h.outcomes(send)
    send = only(step, SendSubmit)
    assert send.runs == Runs(b, [1])
    assert reply(h.outcomes(send)).acted == 3


def test_release_refusals() -> None:
    h = Harness()
    m = held(h, hold=())
    r = reply(h.request(ReleaseRequested, m))
    assert r.acted == 0 and f"job {m}: has no held subjobs to release" in str(r.error)
    r = reply(h.request(ReleaseRequested, (m, 1)))
    assert f"job {m}.1: cannot release a job that is submitted (only held jobs)" in str(r.error)
    r = reply(h.request(ReleaseRequested, (m, 7)))
    assert f"job {m}.7: no such job" in str(r.error)
    single = h.add(splits=False)
    r = reply(h.request(ReleaseRequested, single))
    assert f"job {single}: cannot release a job that is new (only held jobs)" in str(r.error)


def test_a_refused_release_stops_even_with_keep_going() -> None:
    h = Harness()
    m = held(h, hold=(1,))
    step = h.request(ReleaseRequested, (m, 0), (m, 1), keep_going=True)
    assert not step.of(SendSubmit) and not step.changes
    assert str(reply(step).error) == (f"release stopped: job {m}.0: cannot release a job that is submitted "
                                      "(only held jobs)")


# ------------------------------------------------------------------ force_status
def test_forcing_ended_and_new_runs_now() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 3)
    h.report(m, [0], S.FAILED, exit_code=1)
    h.report(m, [1], S.HELD, verdict="cancelled")
    h.tick()
    step = h.request(ForceStatusRequested, (m, 1), status=S.COMPLETED)
    assert step.changes[0] == Change(m, [1], S.HELD, S.COMPLETED, h.clock, step.stimulus_id, forced=True)
    assert sids(step) == {step.stimulus_id}
    r = reply(step)
    assert r == Reply(stimulus_id=step.stimulus_id, error=None, acted=1)
    info = h.sm.info((m, 1))
    assert info.get("reason") is None
    entry = info["history"][-1]
    assert entry == {"time": h.clock, "level": "user", "verdict": "forced",
                     "reason": "forced from held to completed by the user", "attempt": 1, "action": "completed"}
    step = h.request(ForceStatusRequested, (m, 1), status=S.FAILED)
    assert h.sm.info((m, 1))["reason"] == "forced to failed by the user"
    assert reply(step).acted == 1


def test_forcing_active_runs_kills_them_first() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 3)
    h.report(m, [2], S.COMPLETED)
    step = h.request(ForceStatusRequested, m, status=S.FAILED)
    kill = only(step, SendKill)
    assert kill.runs == Runs(m, [0, 1]) and kill.stimulus_id == step.stimulus_id
    assert not step.changes and not step.of(Reply)
    step = h.killed(kill)
    assert step.changes[0] == Change(m, [0, 1], S.SUBMITTED, S.FAILED, h.clock, kill.stimulus_id, forced=True)
    r = reply(step)
    assert r.error is None and r.acted == 2
    assert h.status(m, 2) == S.COMPLETED


def test_forcing_with_force_moves_active_runs_at_once_and_unwatches_them() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 3)
    step = h.request(ForceStatusRequested, (m, 0), (m, 1), status=S.COMPLETED, force=True)
    assert not step.of(SendKill)
    assert step.of(Unwatch) == [Unwatch(stimulus_id=step.stimulus_id, backend="sim", runs=Runs(m, [0, 1]))]
    assert reply(step).acted == 2
    assert h.status(m, 0) == S.COMPLETED and h.status(m, 2) == S.SUBMITTED


def test_force_refusals() -> None:
    h = Harness()
    m = h.add()
    r = reply(h.request(ForceStatusRequested, m, status=S.RUNNING))
    assert f"job {m}: force_status takes 'failed' or 'completed', not 'running' [field status]" in str(r.error)
    table = RunTable.restore(bytearray([S.SUBMITTED.code, S.SUBMITTING.code]), [1, 1], {}, {})
    h.sm.load(m, profile(), created=1.0, table=table, master=True)  # left submitting by a crash
    r = reply(h.request(ForceStatusRequested, (m, 1), status=S.FAILED))
    assert f"job {m}.1: is being submitted: try again once it is submitted [field status]" in str(r.error)
    assert r.acted == 0


# ------------------------------------------------------------------ a lost run
def test_a_lost_run_is_killed_at_its_backend_and_judged() -> None:
    h = Harness()
    m = h.add(limits=limits(unhandled=1))
    h.submit_all(m, 3)
    h.report(m, [2], S.COMPLETED)
    step = h.post(RunLost(stimulus_id="lost", time=h.clock, runs=Runs(m, [1, 2]), reason="no word for 1 h"))
    kill = only(step, SendKill)
    assert kill.runs == Runs(m, [1]) and kill.stimulus_id == "lost"
    assert only(step, SendSubmit).runs == Runs(m, [1])
    assert {c.stimulus_id for c in step.changes} == {"lost"}
    assert (m, [1], S.SUBMITTED, S.FAILED) in [(c.job, c.indexes, c.old, c.new) for c in step.changes]
    entry = h.sm.info((m, 1))["history"][-1]
    assert entry["reason"] == "no word for 1 h" and entry["verdict"] == "late_unhandled"
    assert h.sm.info((m, 0)).get("history") is None
    h.outcomes(only(step, SendSubmit))
    h.killed(kill)  # the lost attempt's kill: the run's retry goes on
    assert h.status(m, 1) == S.SUBMITTED
    assert not h.post(RunLost(stimulus_id="x", time=h.clock, runs=Runs(99), reason="r"))


def test_a_failed_preparation_rolls_the_job_back_and_answers_with_the_error() -> None:
    h = Harness()
    m = h.add()
    step = h.request(SubmitRequested, m, keep_going=True)
    step = h.post(PrepareFailed(stimulus_id=step.stimulus_id, time=h.clock, job=m,
                                error=JobError("bad splitter", fqid=str(m))))
    assert not step.of(Unprepare)
    assert {c.stimulus_id for c in step.changes} == {step.stimulus_id}
    r = reply(step)
    assert str(r.error) == f"job {m}: bad splitter"
    assert h.status(m) == S.NEW
