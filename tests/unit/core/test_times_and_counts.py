"""Times, counts and settings read through the state machine: the master status order by default and as
set, a request's counts, a master's own times, the entry times of runs that ended, refusals that do not stop
a keep_going request (core.machine, core.requests, core.base, core.jobs, core.flow)."""

from __future__ import annotations

from orchestrator.core.events import AddRequested, KillRequested, ResubmitRequested, SubmitRequested
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import SendKill, SendSubmit
from orchestrator.core.machine import StateMachine
from orchestrator.core.statuses import JobStatus

from .harness import Harness, only, profile, reply

S = JobStatus


def two_running_one_submitted(h: Harness) -> int:
    m = h.add()
    h.submit_all(m, 3)
    h.report(m, [0, 1], S.RUNNING)
    return m


# ------------------------------------------------------------------ the master status order
def test_a_machine_made_without_an_order_shows_submitted_first() -> None:
    h = Harness()
    h.sm = StateMachine()
    m = two_running_one_submitted(h)
    assert h.status(m) == S.SUBMITTED


def test_a_job_added_to_a_running_first_machine_shows_running_first() -> None:
    h = Harness("running-first")
    m = two_running_one_submitted(h)
    assert h.status(m) == S.RUNNING


def test_adding_a_job_counts_one() -> None:
    h = Harness()
    step = h.post(AddRequested(stimulus_id="add", time=h.clock, targets=((0,),), profile=profile()))
    assert reply(step).acted == 1 and reply(step).error is None


# ------------------------------------------------------------------ a master's own times
def test_a_master_being_split_shows_when_its_submission_began() -> None:
    h = Harness()
    m = h.add()
    h.tick(10)
    step = h.request(SubmitRequested, m)
    assert h.status(m) == S.SUBMITTING
    assert h.sm.info((m,))["timestamps"]["submitting"] == h.clock
    h.tick(10)
    h.outcomes(only(h.prepared(step, m, 2), SendSubmit))
    assert h.sm.info((m,))["timestamps"]["submitting"] == h.clock - 10


def test_a_masters_final_times_go_when_a_subjob_is_resubmitted() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    h.tick(5)
    h.report(m, [0, 1], S.FAILED, exit_code=1)
    stamps = h.sm.info((m,))["timestamps"]
    assert stamps["final"] == h.clock and stamps["failed"] == h.clock
    h.tick(5)
    h.request(ResubmitRequested, (m, 1))
    stamps = h.sm.info((m,))["timestamps"]
    assert "final" not in stamps and "failed" not in stamps


# ------------------------------------------------------------------ entry times of runs
def test_each_run_keeps_when_it_was_held_failed_or_killed() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 3)
    h.tick()
    h.report(m, [0], S.HELD, verdict="cancelled")
    h.tick()
    h.report(m, [1], S.FAILED, exit_code=1)
    h.tick()
    step = h.request(KillRequested, (m, 2))
    h.killed(only(step, SendKill))
    assert h.sm.info((m, 0))["timestamps"]["held"] == h.clock - 2
    assert h.sm.info((m, 1))["timestamps"]["failed"] == h.clock - 1
    assert h.sm.info((m, 2))["timestamps"]["killed"] == h.clock
    assert "failed" not in h.sm.info((m, 0))["timestamps"]


def test_runs_ending_from_two_statuses_take_the_reports_times_alike() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    h.report(m, [1], S.RUNNING)
    h.tick(100)
    h.report(m, [0, 1], S.COMPLETED, started=1020.0, ended=1090.0)
    for i in (0, 1):
        assert h.sm.info((m, i))["timestamps"]["running"] == 1020.0
        assert h.sm.info((m, i))["timestamps"]["completed"] == 1090.0


# ------------------------------------------------------------------ keep_going
def test_a_refused_target_does_not_stop_a_keep_going_request_over_other_jobs() -> None:
    h = Harness()
    a = h.add()
    h.submit_all(a, 2)
    b = h.add()
    h.submit_all(b, 2)
    step = h.request(KillRequested, 99, a, b, keep_going=True)
    assert [s.runs for s in step.of(SendKill)] == [Runs(a, [0, 1]), Runs(b, [0, 1])]
    h.killed(step.of(SendKill)[0])
    r = reply(h.killed(step.of(SendKill)[1]))
    assert r.acted == 4 and r.error is None


# ------------------------------------------------------------------ what a move marks to write
def test_a_single_job_that_moves_is_written_whole_and_a_master_run_by_run() -> None:
    h = Harness()
    job = h.add(profile(splits=False))
    step = h.prepared(h.request(SubmitRequested, job), job, 0)
    h.sm.take_dirty()
    h.outcomes(only(step, SendSubmit))
    assert h.sm.take_dirty() == ({job: None}, {job})
    m = h.add()
    h.submit_all(m, 3)
    h.sm.take_dirty()
    h.report(m, [0, 2], S.RUNNING)
    assert h.sm.take_dirty()[0] == {m: {0, 2}}
    h.report(m, [1], S.RUNNING)
    assert h.sm.take_dirty()[0] == {m: {1}}
