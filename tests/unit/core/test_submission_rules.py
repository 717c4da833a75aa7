"""Submission, keep_going and bulk (docs/design.md), every case, decided by the state machine alone."""

from __future__ import annotations

import pytest

from orchestrator.core.events import KillRequested, ResubmitRequested, SubmitRequested
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import Persist, Prepare, Reply, SendKill, SendSubmit, Unprepare
from orchestrator.core.statuses import JobStatus

from .harness import Harness, only, profile, reply

S = JobStatus
N = 5


def start(h: Harness, native: bool, keep_going: bool, n: int = N) -> tuple[int, SendSubmit]:
    job = h.add(profile(native_submit=native))
    step = h.request(SubmitRequested, job, keep_going=keep_going)
    assert only(step, Prepare).job == job and h.status(job) == S.SUBMITTING  # shown while it is split
    step = h.prepared(step, job, n)
    send = only(step, SendSubmit)
    assert send.native is native and send.stop_on_failure is (not keep_going) and send.runs == Runs(job, range(n))
    assert h.sm.counts(job) == {S.SUBMITTING: n} and h.sm.attempt((job, 0)) == 1
    return job, send


def statuses(h: Harness, job: int) -> list[str]:
    return [JobStatus.from_code(c).value for c in h.sm.statuses(job)]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("keep_going", [True, False])
def test_everything_accepted(native: bool, keep_going: bool) -> None:
    h = Harness()
    job, send = start(h, native, keep_going)
    step = h.outcomes(send)
    assert reply(step).error is None and statuses(h, job) == ["submitted"] * N
    assert h.status(job) == S.SUBMITTED  # the pin is gone: derived (rule 1)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("keep_going", [True, False])
def test_partial_rejection(native: bool, keep_going: bool) -> None:
    h = Harness()
    job, send = start(h, native, keep_going)
    if native or keep_going:  # every run attempted
        step = h.outcomes(send, rejected=[(1, "full"), (3, "full")])
    else:  # emulated, keep_going=False: the series stopped at the first failure
        step = h.outcomes(send, accepted=[0], rejected=[(1, "full")], not_attempted=[2, 3, 4])
    got = statuses(h, job)
    left = "failed" if native else "new"
    assert got[1] == left and got[0] == "submitted"
    if not native and not keep_going:
        assert got[2:] == ["new", "new", "new"] and h.sm.attempt((job, 3)) == 0  # not attempted: not counted
    else:
        assert got[3] == left and got[2] == got[4] == "submitted"
    error = reply(step).error
    assert (error is None) is keep_going
    if error is not None:
        assert "failed to submit" in str(error) and error.fqid == str(job)
    assert h.sm.info((job, 1))["reason"] == "submission failed: full"
    assert h.status(job) == S.SUBMITTED  # the submitted ones are monitored to the end


@pytest.mark.parametrize("keep_going", [True, False])
def test_emulated_all_rejected_rolls_the_master_back(keep_going: bool) -> None:
    h = Harness()
    job, send = start(h, False, keep_going)
    step = h.outcomes(send, rejected=[(k, "no") for k in range(N)])
    assert only(step, Unprepare).job == job
    error = reply(step).error
    assert error is not None and "no subjob could be submitted; first error: no" in str(error)
    assert h.status(job) == S.NEW and not h.sm.is_master(job) and h.sm.info((job,))["submit_counter"] == 0


@pytest.mark.parametrize("keep_going", [True, False])
def test_native_all_rejected_are_failed_not_rolled_back(keep_going: bool) -> None:
    h = Harness()
    job, send = start(h, True, keep_going)
    step = h.outcomes(send, rejected=[(k, "no") for k in range(N)])
    assert not step.of(Unprepare) and statuses(h, job) == ["failed"] * N and h.status(job) == S.FAILED
    assert (reply(step).error is None) is keep_going


def test_a_whole_bulk_call_that_failed_counts_as_nothing_submitted() -> None:
    h = Harness()
    job, send = start(h, True, True)
    step = h.outcomes(send, rejected=[(k, "unreachable") for k in range(N)], native=False)
    assert only(step, Unprepare) and h.status(job) == S.NEW


def test_a_job_without_subjobs_rejected_is_new_again_with_the_reason() -> None:
    h = Harness()
    job = h.add(profile(splits=False))
    step = h.request(SubmitRequested, job)
    step = h.prepared(step, job, 0)
    assert [type(i) for i in step.instructions] == [Persist, SendSubmit]  # write-ahead first
    assert h.status(job) == S.SUBMITTING and h.sm.attempt((job,)) == 1
    step = h.outcomes(only(step, SendSubmit), rejected=[(0, "refused")])
    error = reply(step).error
    assert error is not None and str(error) == f"job {job}: submission failed: refused"
    assert h.status(job) == S.NEW and h.sm.attempt((job,)) == 0


def test_requests_on_a_job_are_serialised() -> None:
    h = Harness()
    job = h.add()
    step = h.request(SubmitRequested, job)
    kill = h.request(KillRequested, job)
    assert not kill.instructions  # waits for the submission
    step = h.prepared(step, job, 2)
    step = h.outcomes(only(step, SendSubmit))
    replies = step.of(Reply)
    assert [r.stimulus_id for r in replies] == [step.stimulus_id]
    send = only(step, SendKill)  # the kill went out as soon as the submission was answered
    assert send.stimulus_id == kill.stimulus_id and send.runs == Runs(job, [0, 1])
    step = h.killed(send)
    assert reply(step).stimulus_id == kill.stimulus_id and h.status(job) == S.KILLED


def test_submit_refusals() -> None:
    h = Harness()
    job, send = start(h, True, True, n=2)
    h.outcomes(send)
    error = reply(h.request(SubmitRequested, job)).error
    assert error is not None and "cannot submit a job that is submitted (use resubmit())" in str(error)
    error = reply(h.request(SubmitRequested, (job, 1))).error
    assert error is not None and "a subjob cannot be submitted on its own" in str(error)


def test_resubmit_of_a_rejected_subjob_left_new_submits_it() -> None:
    h = Harness()
    job, send = start(h, False, True, n=3)
    h.outcomes(send, rejected=[(1, "busy")])
    step = h.request(ResubmitRequested, (job, 1))
    send = only(step, SendSubmit)
    assert send.runs == Runs(job, [1]) and h.sm.attempt((job, 1)) == 1
    step = h.outcomes(send, rejected=[(0, "busy again")])
    assert statuses(h, job)[1] == "new"  # it had never run: still left new
    error = reply(step).error
    assert error is not None and "resubmit stopped" in str(error)


def test_master_resubmit_takes_failed_and_new_and_killed_only_when_asked() -> None:
    h = Harness()
    job, send = start(h, True, True, n=4)
    h.outcomes(send, rejected=[(0, "x")])
    h.report(job, [1], S.FAILED)
    h.report(job, [2], S.COMPLETED)
    h.killed(only(h.request(KillRequested, (job, 3)), SendKill))
    assert statuses(h, job) == ["failed", "failed", "completed", "killed"]
    send = only(h.request(ResubmitRequested, job), SendSubmit)
    assert list(send.runs.indexes or ()) == [0, 1]
    h.outcomes(send, rejected=[(0, "x")])
    assert statuses(h, job)[:2] == ["failed", "submitted"]
    send = only(h.request(ResubmitRequested, job, only_failed=False), SendSubmit)
    assert list(send.runs.indexes or ()) == [0, 3]


def test_resubmitting_one_subjob_moves_the_master_back_to_submitted() -> None:
    h = Harness()
    job, send = start(h, True, True, n=2)
    h.outcomes(send)
    h.report(job, None if False else [0, 1], S.COMPLETED)
    assert h.status(job) == S.COMPLETED
    step = h.request(ResubmitRequested, (job, 0))
    assert h.status(job) == S.SUBMITTED
    assert any(c.job == job and c.indexes is None and c.new == S.SUBMITTED for c in step.changes)
