"""Submission, keep_going and bulk (docs/design.md), every case, decided by the state machine alone."""

from __future__ import annotations

import pytest

from orchestrator.core.events import KillOutcomes, KillRequested, ResubmitRequested, SubmitRequested
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


# ------------------------------------------------------------------ kill, with some kills failing
def running(h: Harness, native: bool, n: int = 4) -> int:
    job = h.add(profile(native_kill=native))
    h.submit_all(job, n)
    h.report(job, list(range(n)), S.RUNNING)
    return job


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("keep_going", [True, False])
def test_kill_with_some_kills_failing(native: bool, keep_going: bool) -> None:
    """keep_going=True: every run is attempted and the kill succeeds; keep_going=False: it raises, naming the
    first run that could not be killed. Emulated, keep_going=False stops at that run: the rest are not
    attempted; native, one call attempted them all. What was killed is killed, the rest go on."""
    h = Harness()
    job = running(h, native)
    send = only(h.request(KillRequested, job, keep_going=keep_going), SendKill)
    assert send.native is native and send.stop_on_failure is (not keep_going) and send.runs == Runs(job, range(4))
    if native or keep_going:  # every run attempted: 1 and 3 could not be killed
        step = h.killed(send, killed=[0, 2], failed=[(1, "0.1: permission denied"), (3, "0.3: no answer")])
        expected = ["killed", "running", "killed", "running"]
    else:  # emulated, stopping at the first failure
        step = h.post(KillOutcomes(stimulus_id=send.stimulus_id, time=h.tick(), runs=send.runs, killed=[0],
                                   failed=[(1, "0.1: permission denied")], not_attempted=[2, 3]))
        expected = ["killed", "running", "running", "running"]
    assert statuses(h, job) == expected and h.status(job) == S.RUNNING  # rule 2: the others still run
    error = reply(step).error
    if keep_going:
        assert error is None
    else:
        assert error is not None and str(error) == f"kill stopped: job {job}.1: 0.1: permission denied"
        assert error.fqid == f"{job}.1"
    again = only(h.request(KillRequested, job, keep_going=True), SendKill)  # the survivors can be killed again
    assert list(again.runs.indexes or ()) == [i for i, s in enumerate(expected) if s == "running"]
    step = h.killed(again)
    assert reply(step).error is None and statuses(h, job) == ["killed"] * 4 and h.status(job) == S.KILLED


@pytest.mark.parametrize("keep_going", [True, False])
def test_a_slice_kill_where_one_jobs_kill_fails(keep_going: bool) -> None:
    """Two jobs killed together (emulated): the first one's kill fails. keep_going=False stops there (the second
    is not asked) and raises; keep_going=True goes on with the second and succeeds."""
    h = Harness()
    jobs = []
    for _ in range(2):
        job = h.add(profile(splits=False, native_kill=False))
        step = h.prepared(h.request(SubmitRequested, job), job, 0)
        h.outcomes(only(step, SendSubmit))
        jobs.append(job)
    a, b = jobs
    step = h.request(KillRequested, a, b, keep_going=keep_going)
    sends = step.of(SendKill)
    assert [s.runs for s in sends] == ([Runs(a), Runs(b)] if keep_going else [Runs(a)])
    step = h.killed(sends[0], killed=[], failed=[(0, "no such process")])
    if keep_going:
        assert not step.of(Reply)  # the second kill is still out
        step = h.killed(sends[1])
        assert reply(step).error is None
        assert (h.status(a), h.status(b)) == (S.SUBMITTED, S.KILLED)
    else:
        error = reply(step).error
        assert error is not None and str(error) == f"kill stopped: job {a}: no such process"
        assert not step.of(SendKill) and (h.status(a), h.status(b)) == (S.SUBMITTED, S.SUBMITTED)
