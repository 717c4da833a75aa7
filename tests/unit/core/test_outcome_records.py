"""Outcomes and backends' reports read for what they leave on record: the states a submission starts from,
runs not attempted, the request's errors, what is marked to write, the times and reasons of a clean end
(core.outcomes, core.monitoring)."""

from __future__ import annotations

from typing import Any

from orchestrator.core.events import (
    Event,
    ReleaseRequested,
    ResubmitRequested,
    RunReport,
    StatusReport,
    SubmitOutcomes,
    SubmitRequested,
)
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import Persist, SendSubmit
from orchestrator.core.statuses import JobStatus
from orchestrator.core.step import Refusal, Step

from .harness import Harness, limits, only, profile, reply
from .test_partition import FINAL_STATE, Grid

S = JobStatus


def single(h: Harness, **kw: Any) -> tuple[int, SendSubmit]:
    job = h.add(profile(splits=False, **kw))
    step = h.prepared(h.request(SubmitRequested, job), job, 0)
    return job, only(step, SendSubmit)


# ------------------------------------------------------------------ states a submission starts from
def test_a_single_jobs_starting_state_is_its_own() -> None:
    h = Harness()
    job, send = single(h)
    h.sm.take_dirty()
    h.post(SubmitOutcomes(stimulus_id=send.stimulus_id, time=h.clock, runs=send.runs, accepted=[0],
                          states={0: {"seq": 2}}))
    assert h.status(job) == S.SUBMITTED
    assert h.sm.info((job,))["checkpoint"] == {"seq": 2}


def test_a_retried_subjobs_starting_state_is_kept_on_that_subjob_and_marked() -> None:
    h = Harness()
    m = h.add(limits=limits(early=1))
    h.submit_all(m, 3)
    step = h.report(m, [1], S.FAILED, exit_code=2)
    send = only(step, SendSubmit)
    assert send.runs == Runs(m, [1])
    h.sm.take_dirty()
    h.post(SubmitOutcomes(stimulus_id=send.stimulus_id, time=h.clock, runs=send.runs, accepted=[0],
                          states={0: {"seq": 5, "label": "five"}}))
    assert h.sm.info((m, 1))["checkpoint"] == {"seq": 5, "label": "five"}
    assert "checkpoint" not in h.sm.info((m, 0))
    assert h.sm.take_dirty()[0] == {m: {1}}


# ------------------------------------------------------------------ runs not attempted
def test_a_single_job_not_attempted_is_new_again() -> None:
    h = Harness()
    job, send = single(h, native_submit=False)
    step = h.outcomes(send, accepted=[], not_attempted=[0], native=False)
    assert h.status(job) == S.NEW
    assert reply(step).error is None


def test_a_master_none_of_whose_runs_was_attempted_names_no_first_error() -> None:
    h = Harness()
    m = h.add(profile(native_submit=False))
    step = h.prepared(h.request(SubmitRequested, m), m, 2)
    step = h.outcomes(only(step, SendSubmit), accepted=[], not_attempted=[0, 1], native=False)
    assert str(reply(step).error) == f"job {m}: no subjob could be submitted; first error: ?"
    assert h.status(m) == S.NEW


def test_a_master_rolled_back_counts_its_next_submission_as_its_first() -> None:
    h = Harness()
    m = h.add(profile(native_submit=False))
    step = h.prepared(h.request(SubmitRequested, m), m, 2)
    h.outcomes(only(step, SendSubmit), accepted=[], rejected=[(0, "full"), (1, "full")], native=False)
    h.submit_all(m, 2)
    assert h.sm.info((m,))["submit_counter"] == 1


# ------------------------------------------------------------------ the request's errors
def test_a_release_the_backend_refuses_fails_whatever_keep_going_says() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 3)
    h.report(m, [0, 2], S.HELD, verdict="cancelled")
    step = h.request(ReleaseRequested, m, keep_going=True)
    step = h.outcomes(only(step, SendSubmit), accepted=[1], rejected=[(0, "down")])
    error = reply(step).error
    assert str(error) == f"job {m}: release: 1 submission(s) failed; first, {m}.0: down"
    assert h.status(m, 0) == S.FAILED and h.status(m, 2) == S.SUBMITTED


def test_a_resubmission_refused_run_by_run_names_each_run() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 3)
    h.report(m, [0, 1], S.FAILED, exit_code=1)
    step = h.request(ResubmitRequested, m)
    step = h.outcomes(only(step, SendSubmit), accepted=[], rejected=[(0, "quota"), (1, "")])
    error = reply(step).error
    assert error is not None
    assert str(error) == f"resubmit stopped: job {m}.0: quota"
    assert h.sm.info((m, 1))["reason"] == "submission failed: submission refused"


# ------------------------------------------------------------------ reports: what they are refused for
def test_a_report_for_an_unknown_job_is_refused_and_the_next_report_still_applies() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    step = h.post(StatusReport(stimulus_id=h.sid("poll"), time=h.clock, backend="sim",
                               reports=(RunReport(Runs(99, [0]), S.RUNNING), RunReport(Runs(m, [1]), S.RUNNING))))
    assert step.refusals == [Refusal((99,), "report for an unknown job", step.stimulus_id)]
    assert h.status(m, 1) == S.RUNNING


def test_a_report_for_one_run_past_the_last_is_refused() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    step = h.report(m, [2], S.RUNNING)
    assert step.refusals == [Refusal((m,), "report for runs the job does not have", step.stimulus_id)]
    job, send = single(h)
    h.outcomes(send)
    step = h.report(job, [], S.RUNNING)
    assert step.refusals == []


# ------------------------------------------------------------------ what a report marks to write
def test_a_state_saved_while_running_marks_that_run_only() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 3)
    h.report(m, [1], S.RUNNING)
    h.sm.take_dirty()
    h.report(m, [1], S.RUNNING, state={"seq": 1})
    assert h.sm.take_dirty()[0] == {m: {1}}
    assert h.sm.info((m, 1))["checkpoint"] == {"seq": 1}


def test_an_end_marks_the_runs_that_ended_only() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 3)
    h.sm.take_dirty()
    h.report(m, [1], S.FAILED, exit_code=3)
    assert h.sm.take_dirty()[0] == {m: {1}}


# ------------------------------------------------------------------ a clean end without the wrapper
def test_a_start_time_comes_only_with_running() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    h.report(m, [0], S.SUBMITTED, started=500.0)
    assert "running" not in h.sm.info((m, 0))["timestamps"]
    h.report(m, [0], S.RUNNING, started=500.0)
    assert h.sm.info((m, 0))["timestamps"]["running"] == 500.0


def test_a_clean_end_takes_the_reports_times_and_clears_the_reason() -> None:
    h = Harness()
    m = h.add(limits=limits(early=1))
    h.submit_all(m, 2)
    h.outcomes(only(h.report(m, [0], S.FAILED, exit_code=1), SendSubmit))
    assert h.sm.info((m, 0))["reason"] == "failed"
    h.tick(100)
    h.report(m, [0, 1], S.COMPLETED, started=1010.0, ended=1050.0)
    info = h.sm.info((m, 0))
    assert "reason" not in info
    assert info["timestamps"]["running"] == 1010.0 and info["timestamps"]["completed"] == 1050.0


def test_a_completed_report_with_a_verdict_is_judged() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    h.report(m, [0], S.COMPLETED, verdict="lost")
    assert h.status(m, 0) == S.FAILED
    info = h.sm.info((m, 0))
    assert info["reason"] == "the backend could not be reached"
    assert info["history"][-1]["level"] == "orchestrator" and "completed" not in info["timestamps"]


def test_a_start_time_reported_with_completing_leaves_the_running_time() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    h.report(m, [0], S.RUNNING)
    running = h.sm.info((m, 0))["timestamps"]["running"]
    h.tick(5)
    h.report(m, [0], S.COMPLETING, started=500.0)
    assert h.sm.info((m, 0))["timestamps"]["running"] == running


def test_an_end_the_table_forbids_is_kept_on_the_runs_record() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    h.report(m, [0], S.COMPLETING)
    step = h.report(m, [0], S.HELD, verdict="cancelled")
    assert h.status(m, 0) == S.COMPLETING
    assert step.refusals == [Refusal((m, 0), "illegal transition completing -> held", step.stimulus_id,
                                     S.COMPLETING, S.HELD)]
    assert h.sm.info((m, 0))["refused"] == ["completing->held: illegal transition completing -> held"]


# ------------------------------------------------------------------ what a submission is sent with
def test_a_first_submission_starts_from_the_initial_state_and_a_split_is_not_persisted_again() -> None:
    h = Harness()
    job = h.add(profile(splits=False))
    step = h.prepared(h.request(SubmitRequested, job), job, 0)
    send = only(step, SendSubmit)
    assert send.start == "initial" and send.runs == Runs(job, None) and len(step.of(Persist)) == 1
    m = h.add()
    h.sm.take_dirty()
    step = h.prepared(h.request(SubmitRequested, m), m, 3)
    send = only(step, SendSubmit)
    assert send.start == "initial" and send.runs == Runs(m, range(3)) and not step.of(Persist)
    assert m not in h.sm.take_dirty()[0]  # the runtime wrote them as submitting before it answered


# ------------------------------------------------------------------ a partitioned master's rows to write
def checked(g: Grid) -> Grid:
    """Every step of ``g`` marks only jobs that exist (the master's own row, as a rule) to be written."""
    post = g.h.post

    def post_and_check(event: Event) -> Step:
        step = post(event)
        dirty, tops = g.h.sm.take_dirty()
        known = set(g.h.sm.job_ids())
        assert tops <= known and set(dirty) <= known, (tops, dirty)
        return step

    g.h.post = post_and_check  # type: ignore[method-assign]
    return g


def test_every_row_a_partitioned_master_marks_is_a_job_of_it() -> None:
    g = checked(Grid())
    g.aggregator_submitted()
    g.h.report(2, None, S.FAILED, exit_code=1)
    assert g.status(g.m) == S.FAILED
    g = checked(Grid())
    g.prejob_running()
    g.h.report(1, None, S.FAILED, exit_code=1)
    assert g.status(g.m) == S.FAILED
    g = checked(Grid(min_success=1.0))
    g.subjobs_done(states={0: FINAL_STATE})
    assert g.status(g.m) == S.FAILED
    g = checked(Grid())
    g.aggregator_submitted()
    g.h.report(2, None, S.COMPLETED)
    assert g.status(g.m) == S.COMPLETED
