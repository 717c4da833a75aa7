"""A master's status (docs/design.md's six rules), the order setting, jobs the core does not know, and a
postprocessing failure that a resubmit clears: decided by the state machine alone.

The expected statuses are written out here from the design, case by case, never computed with the core's
own ``master_status``, so that a drift in the rules fails here.
"""

from __future__ import annotations

from array import array

import pytest

from orchestrator.core.events import KillRequested, PostprocessDone, Profile, ResubmitRequested, SubmitRequested
from orchestrator.core.instructions import RunPostprocess, SendSubmit
from orchestrator.core.machine import StateMachine
from orchestrator.core.statuses import JobStatus, master_status
from orchestrator.core.table import RunTable

from .harness import Harness, only, profile, reply

S = JobStatus

# (subjob statuses, shown with "submitted-first", shown with "running-first"); the comment names the rule
# that is the first to match under the default order.
RULE_CASES = [
    ([S.SUBMITTED, S.RUNNING, S.HELD, S.FAILED, S.COMPLETED, S.KILLED], S.SUBMITTED, S.RUNNING),  # 1
    ([S.SUBMITTING, S.COMPLETING, S.NEW], S.SUBMITTED, S.RUNNING),  # 1, by submitting
    ([S.SUBMITTING, S.KILLED], S.SUBMITTED, S.SUBMITTED),  # 1
    ([S.RUNNING, S.HELD, S.FAILED, S.COMPLETED, S.KILLED], S.RUNNING, S.RUNNING),  # 2
    ([S.COMPLETING, S.COMPLETED], S.RUNNING, S.RUNNING),  # 2, by completing
    ([S.SUBMITTED, S.HELD, S.FAILED], S.SUBMITTED, S.SUBMITTED),  # 1; nothing runs: the order is moot
    ([S.HELD, S.FAILED, S.NEW, S.COMPLETED, S.KILLED], S.HELD, S.HELD),  # 3
    ([S.FAILED, S.COMPLETED, S.KILLED], S.FAILED, S.FAILED),  # 4
    ([S.NEW, S.COMPLETED, S.KILLED], S.FAILED, S.FAILED),  # 4, a subjob left new
    ([S.NEW], S.FAILED, S.FAILED),  # 4: every subjob left new
    ([S.COMPLETED, S.KILLED, S.COMPLETED], S.COMPLETED, S.COMPLETED),  # 5
    ([S.KILLED, S.KILLED], S.KILLED, S.KILLED),  # 6
]


def loaded_master(order: str, subjobs: list[JobStatus]) -> StateMachine:
    """A state machine holding master 1 with these subjobs, as a reopened home restores it."""
    sm = StateMachine(order)
    table = RunTable.restore(bytearray(s.code for s in subjobs), array("I", [1] * len(subjobs)), {}, {})
    sm.load(1, Profile("sim", splits=True), created=0.0, table=table, master=True)
    return sm


@pytest.mark.parametrize(("subjobs", "submitted_first", "running_first"), RULE_CASES)
def test_the_six_rules(subjobs: list[JobStatus], submitted_first: JobStatus, running_first: JobStatus) -> None:
    counts: dict[JobStatus, int] = {}
    for s in subjobs:
        counts[s] = counts.get(s, 0) + 1
    assert master_status(counts) is submitted_first
    assert master_status(counts, "running-first") is running_first
    for order, expected in (("submitted-first", submitted_first), ("running-first", running_first)):
        assert loaded_master(order, subjobs).status((1,)) is expected


def test_statuses_counted_zero_times_do_not_count() -> None:
    assert master_status({S.SUBMITTED: 0, S.RUNNING: 0, S.COMPLETED: 2}) is S.COMPLETED


def test_a_master_moves_with_its_subjobs_reports() -> None:
    """Rule by rule as its subjobs move: completing shows running, a held one holds it, a failure fails it."""
    h = Harness()
    job = h.add(profile())
    h.submit_all(job, 3)
    assert h.status(job) == S.SUBMITTED
    h.report(job, [0, 1, 2], S.RUNNING)
    assert h.status(job) == S.RUNNING
    h.report(job, [0], S.COMPLETING)
    h.report(job, [1, 2], S.COMPLETED)
    assert h.status(job) == S.RUNNING  # completing counts as running (rule 2)
    h.report(job, [0], S.COMPLETED)
    assert h.status(job) == S.COMPLETED
    h.request(ResubmitRequested, (job, 1))
    assert h.status(job) == S.SUBMITTED  # submitting counts as submitted (rule 1)


@pytest.mark.parametrize("order", ["bogus", "", "Running-First", "running_first"])
def test_an_unknown_order_is_refused(order: str) -> None:
    with pytest.raises(ValueError, match="master_status_order must be one of"):
        StateMachine(order)
    with pytest.raises(ValueError, match="master_status_order"):
        master_status({S.RUNNING: 1}, order)


def test_jobs_the_core_does_not_know_are_refused_and_change_nothing() -> None:
    h = Harness()
    job = h.add(profile())
    h.submit_all(job, 2)
    for kind, target in ((KillRequested, 99), (KillRequested, (job, 7)), (SubmitRequested, 99),
                         (ResubmitRequested, (99, 0))):
        error = reply(h.request(kind, target)).error
        fq = ".".join(map(str, target)) if isinstance(target, tuple) else str(target)
        assert error is not None and f"job {fq}: no such job" in str(error) and error.fqid == fq
    step = h.report(99, None, S.RUNNING)
    assert [r.reason for r in step.refusals] == ["report for an unknown job"] and not step.changes
    step = h.report(job, [5], S.RUNNING)
    assert [r.reason for r in step.refusals] == ["report for runs the job does not have"] and not step.changes
    assert (99,) not in h.sm and (job, 2) not in h.sm
    with pytest.raises(KeyError, match="no job 99"):
        h.sm.status((99,))
    assert h.sm.counts(job) == {S.SUBMITTED: 2} and h.status(job) == S.SUBMITTED


def test_a_failed_postprocessor_is_cleared_by_a_resubmit_that_makes_the_master_completed() -> None:
    h = Harness()
    job = h.add(profile(postprocess=True))
    h.submit_all(job, 2)
    step = h.report(job, [0, 1], S.COMPLETED)
    post = only(step, RunPostprocess)
    h.post(PostprocessDone(stimulus_id=post.stimulus_id, time=h.tick(), job=job, error="merger: no file out.txt"))
    assert h.status(job) == S.FAILED and h.sm.info((job,))["reason"] == "merger: no file out.txt"
    send = only(h.request(ResubmitRequested, (job, 1)), SendSubmit)
    assert h.status(job) == S.SUBMITTED
    h.outcomes(send)
    step = h.report(job, [1], S.COMPLETED)
    assert h.status(job) == S.COMPLETED  # the verdict on the runs before is gone: never failed again meanwhile
    assert all(c.new != S.FAILED for c in step.changes)
    post = only(step, RunPostprocess)  # the postprocessors run again, on the new outcome
    h.post(PostprocessDone(stimulus_id=post.stimulus_id, time=h.tick(), job=job))
    assert h.status(job) == S.COMPLETED and h.sm.info((job,)).get("reason") is None
