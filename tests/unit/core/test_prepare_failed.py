"""A submission whose split or configuration failed: the job is new again on disk before the error is answered."""

from __future__ import annotations

from orchestrator.core.errors import JobError
from orchestrator.core.events import PrepareFailed, SubmitRequested
from orchestrator.core.instructions import Persist, Prepare, Reply
from orchestrator.core.statuses import JobStatus

from .harness import Harness, only


def test_a_failed_split_is_written_back_before_the_error_is_answered() -> None:
    h = Harness()
    m = h.add()  # a job with a splitter: a master-to-be while it is split
    step = h.request(SubmitRequested, m)
    prepare = only(step, Prepare)
    assert h.sm.status((m,)) == JobStatus.SUBMITTING
    step = h.post(PrepareFailed(stimulus_id=prepare.stimulus_id, time=h.clock, job=m,
                                error=JobError("the lists differ in length", fqid=str(m), field="splitter")))
    kinds = [type(i) for i in step.instructions]
    assert Persist in kinds and Reply in kinds and kinds.index(Persist) < kinds.index(Reply), kinds
    assert h.sm.status((m,)) == JobStatus.NEW and not h.sm.is_master(m)
    assert "the lists differ in length" in str(only(step, Reply).error)
