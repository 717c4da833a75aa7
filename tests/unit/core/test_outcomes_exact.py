"""Outcomes read exactly: rolled-back submissions, lookups, linked jobs' later rounds, kills that failed,
postprocessors' verdicts on a partitioned master (core.outcomes)."""

from __future__ import annotations

from orchestrator.core.events import (
    KillOutcomes,
    KillRequested,
    LinkedAdded,
    LookupOutcomes,
    PostprocessDone,
    Prepared,
    Started,
    SubmitRequested,
)
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import CreateLinked, Persist, RunPostprocess, SendKill, SendSubmit
from orchestrator.core.statuses import JobStatus
from orchestrator.core.step import Change

from .harness import Harness, only, profile, reply

S = JobStatus


def test_a_master_none_of_whose_runs_was_taken_is_new_again_with_its_counter_back() -> None:
    h = Harness()
    m = h.add(profile(native_submit=False))
    step = h.prepared(h.request(SubmitRequested, m), m, 2)
    assert h.sm.info((m,))["submit_counter"] == 1
    h.tick()
    h.sm.take_dirty()
    step = h.outcomes(only(step, SendSubmit), accepted=[], rejected=[(0, "full"), (1, "full")], native=False)
    assert Change(m, None, S.SUBMITTING, S.NEW, h.clock, step.stimulus_id) in step.changes
    assert h.sm.info((m,))["submit_counter"] == 0 and not h.sm.is_master(m)
    assert m in h.sm.take_dirty()[0]
    assert str(reply(step).error) == f"job {m}: no subjob could be submitted; first error: full"


def test_a_single_job_rolled_back_keeps_no_reason() -> None:
    h = Harness()
    job = h.add(profile(splits=False, native_submit=False))
    step = h.prepared(h.request(SubmitRequested, job), job, 0)
    step = h.outcomes(only(step, SendSubmit), accepted=[], rejected=[(0, "full")], native=False)
    assert h.status(job) == S.NEW
    assert h.sm.info((job,)).get("reason") is None and h.sm.info((job,)).get("history") is None
    assert str(reply(step).error) == f"job {job}: submission failed: full"


def test_a_lookup_resends_under_its_stimulus_without_persisting_again() -> None:
    h = Harness()
    m = h.add()
    step = h.prepared(h.request(SubmitRequested, m), m, 3)
    h.outcomes(only(step, SendSubmit), accepted=[0])
    step = h.post(LookupOutcomes(stimulus_id="look", time=h.clock, runs=Runs(m, [1, 2]), found=[1], absent=[0]))
    assert not step.of(Persist)
    send = only(step, SendSubmit)
    assert send.stimulus_id == "look" and send.runs == Runs(m, [1])
    assert {c.stimulus_id for c in step.changes} == {"look"}
    step = h.outcomes(send, accepted=[], rejected=[(0, "gone")])
    assert h.status(m, 1) == S.FAILED  # a resend's rejection fails the run


def test_a_kill_that_failed_is_reported_per_run() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    kill = only(h.request(KillRequested, m), SendKill)
    step = h.killed(kill, killed=[0], failed=[(1, "")])
    assert str(reply(step).error).endswith(f"job {m}.1: kill failed")
    assert h.status(m, 0) == S.KILLED and h.status(m, 1) == S.SUBMITTED
    assert not h.post(KillOutcomes(stimulus_id="nobody", time=h.clock, runs=Runs(m, [0]), killed=[0]))


def test_a_linked_job_added_is_new_from_the_event_time() -> None:
    h = Harness()
    m = h.add(prejob=True)
    step = h.prepared(h.request(SubmitRequested, m), m, 2)
    h.tick(5)
    h.post(LinkedAdded(stimulus_id=step.stimulus_id, time=h.clock, job=1, master=m, role="prejob",
                       profile=profile(splits=False)))
    assert h.sm.info((1,))["timestamps"] == {"new": h.clock}
    assert h.sm.status((1,)) == S.NEW


def test_a_later_round_of_the_aggregator_is_sent_from_its_first_state() -> None:
    h = Harness()
    m = h.add(aggregator=True)
    step = h.prepared(h.request(SubmitRequested, m), m, 1)
    h.outcomes(only(step, SendSubmit))
    h.report(m, [0], S.RUNNING, state={"final": True, "label": "a"})
    step = h.report(m, [0], S.COMPLETED)
    sid = only(step, CreateLinked).stimulus_id
    h.post(LinkedAdded(stimulus_id=sid, time=h.clock, job=1, master=m, role="aggregator",
                       profile=profile(splits=False)))
    h.outcomes(only(h.post(Prepared(stimulus_id=sid, time=h.clock, job=1)), SendSubmit))
    h.report(1, None, S.COMPLETED)
    from orchestrator.core.events import ResubmitRequested

    h.outcomes(only(h.request(ResubmitRequested, (m, 0)), SendSubmit))
    step = h.report(m, [0], S.COMPLETED)
    sid = only(step, CreateLinked).stimulus_id
    step = h.post(LinkedAdded(stimulus_id=sid, time=h.clock, job=1, master=m, role="aggregator",
                              profile=profile(splits=False)))
    send = only(step, SendSubmit)
    assert send.stimulus_id == sid and send.start == "initial" and send.runs == Runs(1)
    assert Change(1, None, S.COMPLETED, S.SUBMITTING, h.clock, sid) in step.changes
    h.outcomes(send)
    assert h.status(m) == S.SUBMITTED
    h.report(1, None, S.COMPLETED)
    assert h.status(m) == S.COMPLETED


def test_postprocessors_passing_keep_an_aggregators_failure() -> None:
    h = Harness()
    m = h.add(aggregator=True, postprocess=True)
    step = h.prepared(h.request(SubmitRequested, m), m, 1)
    h.outcomes(only(step, SendSubmit))
    h.report(m, [0], S.RUNNING, state={"final": True, "label": "a"})
    step = h.report(m, [0], S.COMPLETED)
    post_sid = only(step, RunPostprocess).stimulus_id
    sid = only(step, CreateLinked).stimulus_id
    h.post(LinkedAdded(stimulus_id=sid, time=h.clock, job=1, master=m, role="aggregator",
                       profile=profile(splits=False)))
    h.outcomes(only(h.post(Prepared(stimulus_id=sid, time=h.clock, job=1)), SendSubmit))
    h.report(1, None, S.FAILED, exit_code=1, reason="merge broke")
    assert h.sm.info((m,))["reason"] == "aggregator 1 failed: merge broke"
    h.post(PostprocessDone(stimulus_id=post_sid, time=h.clock, job=m))
    assert h.sm.info((m,))["reason"] == "aggregator 1 failed: merge broke"
    assert h.status(m) == S.FAILED


def test_a_merge_time_is_kept_so_a_restart_does_not_postprocess_again() -> None:
    h = Harness()
    m = h.add(postprocess=True)
    h.submit_all(m, 1)
    step = h.report(m, [0], S.COMPLETED)
    h.tick()
    h.post(PostprocessDone(stimulus_id=only(step, RunPostprocess).stimulus_id, time=h.clock, job=m))
    assert not h.post(Started(stimulus_id="s", time=h.tick())).of(RunPostprocess)
    assert not h.sm.active((m,))
