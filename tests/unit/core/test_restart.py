"""Jobs loaded again after a restart, what ``Started`` settles, refused automatic retries, postprocessors'
verdicts, and removal (core.machine.load, core.monitoring, core.outcomes, core.requests)."""

from __future__ import annotations

from array import array

from orchestrator.core.events import MergeRequested, PostprocessDone, RemoveRequested, Started, SubmitRequested
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import Forget, Lookup, RunPostprocess, ScheduleRetry, SendSubmit
from orchestrator.core.statuses import JobStatus
from orchestrator.core.step import Step
from orchestrator.core.table import RunExtra, RunTable

from .harness import Harness, limits, only, profile, reply

S = JobStatus
INTERRUPTED = "submission interrupted by a restart; the backend cannot say whether it got it: check, then resubmit"


def table(*statuses: JobStatus, final: float = 0.0) -> RunTable:
    n = len(statuses)
    return RunTable.restore(bytearray(s.code for s in statuses), [1] * n, {"final": array("d", [final] * n)}, {})


def moves(step: Step) -> list[tuple[object, str, str]]:
    return [(c.indexes, c.old.value, c.new.value) for c in step.changes]


# ------------------------------------------------------------------ loading
def test_load_a_master_as_stored() -> None:
    h = Harness()
    h.sm.load(5, profile(), created=10.0, table=table(S.COMPLETED, S.RUNNING), top={"reason": "r"},
              partition={"phase": "subjobs"}, attempt=2, master=True)
    assert h.sm.status((5,)) == S.RUNNING and h.sm.is_master(5) and h.sm.n_subjobs(5) == 2
    info = h.sm.info((5,))
    assert info["reason"] == "r" and info["timestamps"]["new"] == 10.0 and info["submit_counter"] == 2
    assert info["partition"] == {"phase": "subjobs"}
    assert h.sm.status((5, 0)) == S.COMPLETED


def test_load_keeps_a_stored_new_time_and_link() -> None:
    h = Harness()
    h.sm.load(6, profile(splits=False), created=10.0, top={"timestamps": {"new": 3.0}}, link=(5, "prejob"))
    assert not h.sm.is_master(6) and h.sm.n_subjobs(6) == 0
    assert h.sm.info((6,))["partition"] == {"master": 5, "role": "prejob"}
    assert h.sm.status((6,)) == S.NEW


def test_a_master_flag_without_runs_is_a_single_job() -> None:
    h = Harness()
    h.sm.load(7, profile(), created=1.0, table=RunTable(0), master=True)
    assert not h.sm.is_master(7)
    h.sm.load(8, profile(), created=1.0, table=table(S.NEW), master=False)
    assert not h.sm.is_master(8)


def test_a_master_waiting_on_its_linked_job_shows_submitted_until_it_reports() -> None:
    for phase, shown in (("starting", S.SUBMITTED), ("prejob", S.SUBMITTED), ("aggregator", S.SUBMITTED),
                         ("subjobs", S.COMPLETED), ("aggregator-ended", S.COMPLETED)):
        h = Harness()
        h.sm.load(5, profile(), created=1.0, table=table(S.COMPLETED, S.COMPLETED), partition={"phase": phase},
                  master=True)
        assert h.sm.status((5,)) == shown, phase


def test_load_with_a_failed_postprocessor_and_its_merge_time() -> None:
    h = Harness()
    h.sm.load(5, profile(postprocess=True), created=1.0, table=table(S.COMPLETED, final=50.0), master=True,
              post_failed=True, merged_at=60.0)
    assert h.sm.status((5,)) == S.FAILED
    assert not h.post(Started(stimulus_id="s", time=70.0)).of(RunPostprocess)  # merged after the end


def test_retry_args_of_a_run() -> None:
    h = Harness()
    t = table(S.HELD, S.HELD)
    t.extras[1] = RunExtra(retry_args=["--again"])
    h.sm.load(5, profile(), created=1.0, table=t, master=True)
    assert h.sm.retry_args((5, 1)) == ["--again"] and h.sm.retry_args((5, 0)) == []
    args = h.sm.retry_args((5, 1))
    args.append("x")
    assert h.sm.retry_args((5, 1)) == ["--again"]
    h.sm.load(6, profile(splits=False), created=1.0, table=t)
    assert h.sm.retry_args((6,)) == []


# ------------------------------------------------------------------ Started
def test_started_runs_the_postprocessors_of_a_master_that_ended_meanwhile() -> None:
    h = Harness()
    h.sm.load(5, profile(postprocess=True), created=1.0, table=table(S.COMPLETED, S.FAILED, final=50.0),
              master=True, merged_at=40.0)
    h.sm.load(6, profile(), created=1.0, table=table(S.COMPLETED, final=50.0), master=True, merged_at=40.0)
    h.sm.load(7, profile(postprocess=True), created=1.0, table=table(S.COMPLETED, S.RUNNING, final=50.0),
              master=True)
    h.sm.load(8, profile(postprocess=True), created=1.0, table=table(S.COMPLETED, final=50.0), master=True,
              partition={"phase": "aggregator"})
    h.sm.load(9, profile(postprocess=True), created=1.0, table=table(S.COMPLETED, final=50.0), master=True,
              merged_at=50.0)
    step = h.post(Started(stimulus_id="s", time=100.0))
    assert step.instructions == [RunPostprocess(stimulus_id="s", job=5)]
    assert h.sm.active((5,)) and not h.sm.active((5,), postprocess=False)


def test_started_puts_interrupted_submissions_back_or_resends_retries() -> None:
    h = Harness()
    m = h.add(limits=limits(early=1))
    h.submit_all(m, 3)
    step = h.report(m, [0], S.FAILED, exit_code=1)  # an automatic retry, left submitting by a crash
    assert step.of(SendSubmit)
    step = h.request(SubmitRequested, h.add())
    step = h.prepared(step, 1, 2)  # a user's submission, left submitting by a crash
    step = h.post(Started(stimulus_id="start", time=h.tick()))
    assert moves(step) == [([0, 1], "submitting", "new")]
    send = only(step, SendSubmit)
    assert send.runs == Runs(m, [0]) and send.start == "resume"
    assert h.sm.info((1, 0))["reason"] == INTERRUPTED
    assert h.sm.info((m, 0)).get("reason") != INTERRUPTED
    assert h.sm.counts(1)[S.NEW] == 2


def test_started_looks_up_interrupted_runs_when_the_driver_can() -> None:
    h = Harness()
    m = h.add(lookup=True)
    step = h.request(SubmitRequested, m)
    h.prepared(step, m, 2)
    step = h.post(Started(stimulus_id="start", time=h.tick()))
    assert step.instructions == [Lookup(stimulus_id="start", backend="sim", runs=Runs(m, [0, 1]),
                                        attempts=array("q", [1, 1]))]
    assert not step.changes and h.sm.indexes(m, [S.SUBMITTING]) == [0, 1]


# ------------------------------------------------------------------ a refused automatic retry
def test_a_refused_retry_is_sent_again_later_while_the_limits_allow() -> None:
    h = Harness()
    m = h.add(limits=limits(early=1, unhandled=1))
    h.submit_all(m, 3)
    send = only(h.report(m, [0, 1], S.FAILED, exit_code=1), SendSubmit)
    step = h.outcomes(send, accepted=[], rejected=[(0, "unreachable"), (1, "")])
    assert step.instructions == [ScheduleRetry(stimulus_id=send.stimulus_id, runs=Runs(m, [0, 1]),
                                               at=h.clock + 2.0)]
    assert not step.changes
    info = h.sm.info((m, 0))
    assert info["reason"] == "submission failed: unreachable"
    assert info["history"][-1]["verdict"] == "late_unhandled" and info["history"][-1]["level"] == "orchestrator"
    assert h.sm.info((m, 1))["reason"] == "submission failed: submission refused"
    assert h.sm.indexes(m, [S.SUBMITTING]) == [0, 1]


def test_a_refused_retry_fails_once_the_limits_are_used() -> None:
    h = Harness()
    m = h.add(limits=limits(early=1))
    h.submit_all(m, 2)
    send = only(h.report(m, [0], S.FAILED, exit_code=1), SendSubmit)
    step = h.outcomes(send, accepted=[], rejected=[(0, "unreachable")])
    assert not step.of(ScheduleRetry)
    assert moves(step)[0] == ([0], "submitting", "failed")
    assert h.sm.info((m, 0))["reason"] == "submission failed: unreachable"


# ------------------------------------------------------------------ postprocessors' verdicts
def ended(h: Harness, n: int = 2) -> tuple[int, str]:
    m = h.add(postprocess=True)
    h.submit_all(m, n)
    step = h.report(m, list(range(n)), S.COMPLETED)
    return m, only(step, RunPostprocess).stimulus_id


def test_postprocessors_that_pass() -> None:
    h = Harness()
    m, sid = ended(h)
    h.sm.take_dirty()
    step = h.post(PostprocessDone(stimulus_id=sid, time=77.0, job=m))
    assert h.status(m) == S.COMPLETED and not h.sm.active((m,)) and not step.changes
    assert h.sm.info((m,)).get("reason") is None
    assert m in h.sm.take_dirty()[1]


def test_postprocessors_that_fail_the_master() -> None:
    h = Harness()
    m, sid = ended(h)
    step = h.post(PostprocessDone(stimulus_id=sid, time=77.0, job=m, error="merge failed"))
    assert moves(step) == [(None, "completed", "failed")]
    assert h.sm.info((m,))["reason"] == "merge failed" and not h.sm.active((m,))
    # a later merge that passes clears it
    step = h.request(MergeRequested, m)
    h.post(PostprocessDone(stimulus_id=step.stimulus_id, time=80.0, job=m))
    assert h.status(m) == S.COMPLETED and h.sm.info((m,)).get("reason") is None


def test_a_checker_fails_some_subjobs() -> None:
    h = Harness()
    m, sid = ended(h, 3)
    step = h.post(PostprocessDone(stimulus_id=sid, time=77.0, job=m, failed_subjobs=[(1, "bad output")]))
    assert h.status(m, 1) == S.FAILED and h.status(m, 0) == S.COMPLETED
    assert (([1], "completed", "failed")) in moves(step)
    assert "bad output" in str(h.sm.info((m, 1)).get("reason"))
    assert h.status(m) == S.FAILED and not h.sm.active((m,))


def test_a_postprocess_done_for_an_unknown_job() -> None:
    assert not Harness().post(PostprocessDone(stimulus_id="x", time=1.0, job=4))


# ------------------------------------------------------------------ removal
def test_remove_forgets_the_job_and_unlinks_its_linked_jobs() -> None:
    h = Harness()
    h.sm.load(5, profile(), created=1.0, table=table(S.COMPLETED), master=True, partition={"prejob": 6})
    h.sm.load(6, profile(splits=False), created=1.0, table=table(S.COMPLETED), link=(5, "prejob"))
    h.sm.load(7, profile(splits=False), created=1.0, table=table(S.COMPLETED), link=(9, "prejob"))
    step = h.request(RemoveRequested, 5)
    assert step.of(Forget) == [Forget(stimulus_id=step.stimulus_id, job=5)]
    assert reply(step).error is None and reply(step).acted == 1
    assert h.sm.job_ids() == [6, 7]
    assert "partition" not in h.sm.info((6,))
    assert h.sm.info((7,))["partition"] == {"master": 9, "role": "prejob"}


def test_remove_refusals() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    error = reply(h.request(RemoveRequested, m)).error
    assert str(error) == f"job {m}: cannot remove a job that is submitted (kill it first)"
    error = reply(h.request(RemoveRequested, (m, 1))).error
    assert str(error) == f"job {m}.1: a subjob cannot be removed on its own (remove its master)"
    h.report(m, [0, 1], S.COMPLETED)
    new = h.add()
    assert reply(h.request(RemoveRequested, new)).error is None
    assert reply(h.request(RemoveRequested, m)).error is None
    assert h.sm.job_ids() == []


def test_load_defaults() -> None:
    h = Harness()
    h.sm.load(5, profile(postprocess=True), created=2.0, table=table(S.COMPLETED, S.COMPLETED, final=0.5))
    assert not h.sm.is_master(5)
    h.sm.forget(5)  # two runs without the master flag make no valid job (validate_state says so)
    h.sm.load(6, profile(postprocess=True), created=2.0, table=table(S.COMPLETED, S.COMPLETED, final=0.5),
              master=True)
    info = h.sm.info((6,))
    assert info["submit_counter"] == 0 and info["timestamps"] == {"new": 2.0} and "partition" not in info
    assert h.status(6) == S.COMPLETED
    step = h.post(Started(stimulus_id="s", time=3.0))  # never merged: ended after time 0
    assert step.instructions == [RunPostprocess(stimulus_id="s", job=6)]


def test_busy_while_a_request_is_under_way_or_waits() -> None:
    h = Harness()
    a = h.add()
    b = h.add()
    assert not h.sm.busy(a) and not h.sm.busy(b)
    h.request(SubmitRequested, a)
    assert h.sm.busy(a) and not h.sm.busy(b)
    h.request(RemoveRequested, a, b)  # waits for a
    assert h.sm.busy(b) and h.sm.busy(a)
