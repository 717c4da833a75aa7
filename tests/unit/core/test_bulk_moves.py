"""Moves of large batches (whole slices at once) read exactly: the change recorded, attempts, entry times,
what is marked to write, and refusals run by run with their record (core.base)."""

from __future__ import annotations

from orchestrator.core.events import KillRequested, SubmitRequested
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import SendKill, SendSubmit
from orchestrator.core.statuses import JobStatus
from orchestrator.core.step import Change, Refusal

from .harness import Harness, only, profile

S = JobStatus
N = 300  # above the size moved whole


def submitted(h: Harness, n: int = N) -> tuple[int, SendSubmit]:
    m = h.add(profile(native_submit=False))
    step = h.prepared(h.request(SubmitRequested, m), m, n)
    send = only(step, SendSubmit)
    assert step.changes[0] == Change(m, range(n) if n >= 256 else list(range(n)), S.NEW, S.SUBMITTING, h.clock,
                                     step.stimulus_id)
    return m, send


def test_a_whole_submission_moves_as_one_change_with_its_times_and_attempts() -> None:
    h = Harness()
    m, send = submitted(h)
    assert [h.sm.attempt((m, i)) for i in (0, 150, N - 1)] == [1, 1, 1]
    h.tick(7)
    h.sm.take_dirty()
    step = h.outcomes(send)
    assert step.changes[0] == Change(m, list(range(N)), S.SUBMITTING, S.SUBMITTED, h.clock, send.stimulus_id)
    assert h.sm.info((m, 299))["timestamps"]["submitted"] == h.clock
    assert h.sm.info((m, 0))["timestamps"]["submitting"] == h.clock - 7
    assert h.sm.counts(m)[S.SUBMITTED] == N
    assert h.sm.take_dirty()[0] == {m: None}
    assert h.sm.attempt((m, 5)) == 1


def test_a_part_of_the_runs_is_marked_run_by_run() -> None:
    h = Harness()
    m, send = submitted(h)
    h.outcomes(send)
    h.sm.take_dirty()
    h.tick()
    step = h.report(m, range(0, 280), S.RUNNING)
    assert step.changes[0] == Change(m, list(range(0, 280)), S.SUBMITTED, S.RUNNING, h.clock, step.stimulus_id)
    assert h.sm.take_dirty()[0] == {m: set(range(280))}
    assert h.sm.info((m, 279))["timestamps"]["running"] == h.clock
    assert "running" not in h.sm.info((m, 280))["timestamps"]
    step = h.report(m, range(20, 300), S.RUNNING)  # mixed: 260 running already, 20 submitted
    assert step.changes[0] == Change(m, list(range(280, 300)), S.SUBMITTED, S.RUNNING, h.clock, step.stimulus_id)


def test_final_and_sparse_times_of_a_bulk_end() -> None:
    h = Harness()
    m, send = submitted(h)
    h.outcomes(send)
    h.tick(3)
    h.report(m, range(N), S.COMPLETED)
    assert h.sm.info((m, 42))["timestamps"] == {"new": 1000.0, "submitting": 1000.0, "submitted": 1000.0,
                                                "final": 1003.0, "completed": 1003.0}
    assert h.sm.counts(m)[S.COMPLETED] == N


def test_a_bulk_failure_is_final_and_timed() -> None:
    h = Harness()
    m, send = submitted(h)
    h.outcomes(send)
    h.tick(3)
    h.report(m, range(N), S.FAILED, exit_code=2)
    assert h.sm.info((m, 42))["timestamps"] == {"new": 1000.0, "submitting": 1000.0, "submitted": 1000.0,
                                                "failed": 1003.0, "final": 1003.0}


def test_a_bulk_hold_keeps_its_time_per_run() -> None:
    h = Harness()
    m, send = submitted(h)
    h.outcomes(send)
    h.tick(3)
    step = h.report(m, list(range(N)), S.HELD, verdict="cancelled")
    assert h.sm.counts(m)[S.HELD] == N
    ts = h.sm.info((m, 7))["timestamps"]
    assert ts["held"] == h.clock and "final" not in ts
    assert any(c.new == S.HELD and c.indexes is not None and len(c.indexes) == N for c in step.changes)


def test_a_bulk_kill_is_final_and_timed() -> None:
    h = Harness()
    m, send = submitted(h)
    h.outcomes(send)
    kill = only(h.request(KillRequested, m), SendKill)
    h.tick(2)
    step = h.killed(kill)
    assert step.changes[0] == Change(m, list(range(N)), S.SUBMITTED, S.KILLED, h.clock, kill.stimulus_id)
    ts = h.sm.info((m, 3))["timestamps"]
    assert ts["killed"] == h.clock and ts["final"] == h.clock


def test_a_rolled_back_bulk_submission_takes_its_attempt_back() -> None:
    h = Harness()
    m, send = submitted(h)
    step = h.outcomes(send, accepted=[0], not_attempted=list(range(1, N)), native=False)
    assert Change(m, list(range(1, N)), S.SUBMITTING, S.NEW, h.clock, send.stimulus_id) in step.changes
    assert [h.sm.attempt((m, i)) for i in (0, 1, N - 1)] == [1, 0, 0]


def test_runs_named_twice_are_moved_run_by_run() -> None:
    h = Harness()
    m, send = submitted(h)
    h.outcomes(send)
    names = [0, *range(N)]
    step = h.report(m, names, S.RUNNING)
    assert step.changes[0].indexes == list(range(N)) and h.sm.counts(m)[S.RUNNING] == N


def test_a_bulk_move_the_table_forbids_is_refused_run_by_run_on_record() -> None:
    h = Harness()
    m, send = submitted(h)
    h.outcomes(send)
    h.report(m, range(N), S.COMPLETED)
    h.tick()
    step = h.report(m, range(N), S.RUNNING)
    assert not step.changes and len(step.refusals) == N
    reason = "illegal transition completed -> running"
    assert step.refusals[9] == Refusal((m, 9), reason, step.stimulus_id, S.COMPLETED, S.RUNNING)
    assert h.sm.info((m, 9))["refused"] == [f"completed->running: {reason}"]
    assert m in h.sm.take_dirty()[0]


def test_a_single_jobs_refusal_names_the_job() -> None:
    h = Harness()
    job = h.add(splits=False)
    step = h.prepared(h.request(SubmitRequested, job), job, 0)
    h.outcomes(only(step, SendSubmit))
    h.report(job, None, S.COMPLETED)
    step = h.report(job, None, S.RUNNING)
    assert step.refusals == [Refusal((job,), "illegal transition completed -> running", step.stimulus_id,
                                     S.COMPLETED, S.RUNNING)]
    assert h.sm.info((job,))["refused"] == ["completed->running: illegal transition completed -> running"]


def test_a_small_batch_is_not_moved_whole_but_the_same() -> None:
    h = Harness()
    m, send = submitted(h, 3)
    step = h.outcomes(send)
    assert step.changes[0] == Change(m, [0, 1, 2], S.SUBMITTING, S.SUBMITTED, h.clock, send.stimulus_id)
    assert Runs(m, [0, 1, 2]) == step.changes[0].runs
