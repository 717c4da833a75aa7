"""Requests over several top-level jobs count every job's part; what a checker, a restart and a run's own
log leave on record (core.requests, core.monitoring, core.base)."""

from __future__ import annotations

from orchestrator.core.events import (
    ForceStatusRequested,
    KillRequested,
    MergeRequested,
    PostprocessDone,
    ReleaseRequested,
    RemoveRequested,
    ResubmitRequested,
    Started,
    SubmitRequested,
)
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import Persist, Reply, RunPostprocess, SendKill, SendSubmit
from orchestrator.core.statuses import JobStatus
from orchestrator.core.step import Step
from orchestrator.core.table import RunTable

from .harness import Harness, limits, log, only, profile, reply

S = JobStatus


def masters(h: Harness, k: int = 2, n: int = 2) -> list[int]:
    out = []
    for _ in range(k):
        m = h.add()
        h.submit_all(m, n)
        out.append(m)
    return out


def answer_all(h: Harness, step: Step) -> Step:
    """Answer the kills and submissions of a request job by job, until its reply."""
    while not step.of(Reply):
        kills, sends = step.of(SendKill), step.of(SendSubmit)
        step = h.killed(kills[0]) if kills else h.outcomes(sends[0])
    return step


# ------------------------------------------------------------------ counts over several jobs
def test_kill_counts_every_job() -> None:
    h = Harness()
    a, b = masters(h)
    step = answer_all(h, h.request(KillRequested, a, b))
    assert reply(step).acted == 4


def test_force_counts_every_job() -> None:
    h = Harness()
    a, b = masters(h)
    step = h.request(ForceStatusRequested, a, b, status=S.FAILED, force=True)
    assert reply(step).acted == 4
    c, d = masters(h)
    step = answer_all(h, h.request(ForceStatusRequested, c, d, status=S.FAILED))
    assert reply(step).acted == 4


def test_resubmit_release_remove_and_merge_count_every_job() -> None:
    h = Harness()
    a, b = masters(h)
    h.report(a, [0, 1], S.FAILED, exit_code=1)
    h.report(b, [0, 1], S.FAILED, exit_code=1)
    step = answer_all(h, h.request(ResubmitRequested, a, b))
    assert reply(step).acted == 4
    h.report(a, [0, 1], S.HELD, verdict="cancelled")
    h.report(b, [0, 1], S.HELD, verdict="cancelled")
    step = answer_all(h, h.request(ReleaseRequested, a, b))
    assert reply(step).acted == 4
    c, d = (h.add(postprocess=True), h.add(postprocess=True))
    for m in (c, d):
        h.submit_all(m, 1)
        step = h.report(m, [0], S.COMPLETED)
        h.post(PostprocessDone(stimulus_id=only(step, RunPostprocess).stimulus_id, time=h.clock, job=m))
    step = h.request(MergeRequested, c, d)
    assert reply(step).acted == 2 and len(step.of(RunPostprocess)) == 2
    assert {c, d} <= h.sm.take_dirty()[1]
    for m in (c, d):
        h.post(PostprocessDone(stimulus_id=step.stimulus_id, time=h.clock, job=m))
    assert reply(h.request(RemoveRequested, c, d)).acted == 2


# ------------------------------------------------------------------ what is on record
def test_a_checker_failing_a_subjob_is_on_its_history() -> None:
    h = Harness()
    m = h.add(postprocess=True)
    h.submit_all(m, 2)
    step = h.report(m, [0, 1], S.COMPLETED)
    h.tick()
    step = h.post(PostprocessDone(stimulus_id=only(step, RunPostprocess).stimulus_id, time=h.clock, job=m,
                                  failed_subjobs=[(1, "output empty")]))
    info = h.sm.info((m, 1))
    assert info["reason"] == "output empty"
    assert info["history"][-1] == {"time": h.clock, "level": "postprocess", "verdict": "checked",
                                   "reason": "output empty", "attempt": 1, "action": "failed"}
    assert {c.stimulus_id for c in step.changes} == {step.stimulus_id}


def test_a_master_being_postprocessed_cannot_be_removed() -> None:
    h = Harness()
    m = h.add(postprocess=True)
    h.submit_all(m, 1)
    h.report(m, [0], S.COMPLETED)
    error = reply(h.request(RemoveRequested, m)).error
    assert str(error).endswith(f"job {m}: cannot remove a job that is completed (kill it first)")


def test_started_resends_under_its_own_stimulus_without_a_second_persist() -> None:
    h = Harness()
    m = h.add(limits=limits(early=1))
    h.submit_all(m, 2)
    h.report(m, [0], S.FAILED, exit_code=1)  # its retry left submitting by a crash
    other = h.add()
    h.prepared(h.request(SubmitRequested, other), other, 2)
    step = h.post(Started(stimulus_id="start", time=h.tick()))
    assert not step.of(Persist)
    assert only(step, SendSubmit).stimulus_id == "start"
    assert {c.stimulus_id for c in step.changes} == {"start"}
    r = h.outcomes(only(step, SendSubmit), accepted=[], rejected=[(0, "full")])
    assert h.status(m, 0) == S.FAILED and not r.of(SendSubmit)


def test_a_kill_of_a_run_being_submitted_is_refused() -> None:
    h = Harness()
    table = RunTable.restore(bytearray([S.SUBMITTED.code, S.SUBMITTING.code]), [1, 1], {}, {})
    h.sm.load(5, profile(), created=1.0, table=table, master=True)
    error = reply(h.request(KillRequested, (5, 1))).error
    assert str(error).endswith("job 5.1: cannot kill a job that is submitting")


def test_releasing_one_subjob_by_name() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 3)
    h.report(m, [0, 1, 2], S.HELD, verdict="cancelled")
    step = h.request(ReleaseRequested, (m, 2))
    assert only(step, SendSubmit).runs == Runs(m, [2])
    assert {c.stimulus_id for c in step.changes} == {step.stimulus_id}
    assert any(c.indexes is None for c in step.changes)  # the master, held no more
    h.outcomes(only(step, SendSubmit))
    error = reply(h.request(ReleaseRequested, m, (m, 2))).error
    assert str(error).endswith(f"job {m}.2: cannot release a job that is submitted (only held jobs)")


def test_a_rejected_release_fails_its_runs() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    h.report(m, [0, 1], S.HELD, verdict="cancelled")
    send = only(h.request(ReleaseRequested, m), SendSubmit)
    step = h.outcomes(send, accepted=[0], rejected=[(1, "full")])
    assert h.status(m, 1) == S.FAILED and h.status(m, 0) == S.SUBMITTED
    assert "full" in str(reply(step).error)


def test_resubmit_of_an_unknown_job_answers_at_once() -> None:
    h = Harness()
    r = reply(h.request(ResubmitRequested, 99, keep_going=True))
    assert r.error is None and r.acted == 0  # keep_going forgives it
    assert str(reply(h.request(ResubmitRequested, 99)).error) == "resubmit stopped: job 99: no such job"


def test_a_bulk_resubmission_rolled_back_keeps_the_attempt_it_had() -> None:
    h = Harness()
    m = h.add(profile(native_submit=False))
    step = h.prepared(h.request(SubmitRequested, m), m, 300)
    h.outcomes(only(step, SendSubmit))
    h.report(m, range(300), S.FAILED, exit_code=1)
    step = h.request(ResubmitRequested, (m, 0), m)
    send = only(step, SendSubmit)
    assert h.sm.attempt((m, 5)) == 2
    h.outcomes(send, accepted=[0], not_attempted=list(range(1, 300)), native=False)
    assert h.sm.attempt((m, 5)) == 1 and h.sm.attempt((m, 0)) == 2


def test_a_refused_bulk_move_marks_exactly_its_runs() -> None:
    h = Harness()
    m = h.add(profile(native_submit=False))
    step = h.prepared(h.request(SubmitRequested, m), m, 300)
    h.outcomes(only(step, SendSubmit))
    h.report(m, range(300), S.COMPLETED)
    h.sm.take_dirty()
    h.report(m, range(0, 290), S.RUNNING)
    assert h.sm.take_dirty() == ({m: set(range(290))}, {m})


def test_a_runs_own_log_gives_its_times() -> None:
    h = Harness()
    m = h.add(wrapper=True, limits=limits(early=0, handled=0, unhandled=0))
    h.submit_all(m, 3)
    run_log = log("10.0 START 1 node", "20.0 EXIT 3", "30.0 END 3")
    h.report(m, [0], S.FAILED, log=run_log, started=5.0)
    ts = h.sm.info((m, 0))["timestamps"]
    assert ts["running"] == 5.0 and ts["final"] == 30.0
    h.report(m, [1], S.FAILED, log=run_log, ended=10.0)
    ts = h.sm.info((m, 1))["timestamps"]
    assert ts["running"] == 10.0 and ts["final"] == 10.0  # an end at its start is kept
    h.report(m, [2], S.FAILED, log=run_log, ended=9.0)
    ts = h.sm.info((m, 2))["timestamps"]
    assert ts["running"] == 10.0 and ts["final"] == h.clock  # an end before its start is nonsense
