"""Large batches: a submission answered in parts, and moves of whole slices, decided as run by run would."""

from __future__ import annotations

from array import array

import pytest

from orchestrator.core.events import SubmitOutcomes, SubmitRequested
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import Reply, SendSubmit
from orchestrator.core.statuses import JobStatus
from orchestrator.core.step import Step

from .harness import Harness, only, profile, reply

S = JobStatus
N = 1000


def start(h: Harness, n: int = N, native: bool = True, keep_going: bool = True) -> tuple[int, SendSubmit]:
    job = h.add(profile(native_submit=native))
    step = h.prepared(h.request(SubmitRequested, job, keep_going=keep_going), job, n)
    return job, only(step, SendSubmit)


def part(h: Harness, send: SendSubmit, lo: int, hi: int, *, more: bool, rejected: tuple[tuple[int, str], ...] = (),
         not_attempted: tuple[int, ...] = (), native: bool = True) -> Step:
    """Answer positions ``lo:hi`` of a SendSubmit (positions in the answer are the part's own; a part after the
    first names its instruction by the instruction's first run, as the driver's actor does)."""
    named = {k for k, _ in rejected} | set(not_attempted)
    assert send.runs.indexes is not None
    return h.post(SubmitOutcomes(stimulus_id=send.stimulus_id, time=h.clock, runs=Runs(send.runs.job, range(lo, hi)),
                                 accepted=[k for k in range(hi - lo) if k not in named], rejected=list(rejected),
                                 not_attempted=list(not_attempted), native=native, more=more,
                                 first=None if lo == 0 else send.runs.indexes[0]))


def test_the_request_is_answered_with_the_last_part() -> None:
    h = Harness()
    job, send = start(h)
    first = part(h, send, 0, 400, more=True)
    assert not first.of(Reply) and h.sm.counts(job) == {S.SUBMITTED: 400, S.SUBMITTING: 600}
    assert h.status(job) == S.SUBMITTING  # still pinned while parts are to come
    h.report(job, range(0, 400), S.RUNNING)  # its first runs are watched while the rest is sent
    last = part(h, send, 400, N, more=False)
    assert reply(last).error is None
    assert h.sm.counts(job) == {S.RUNNING: 400, S.SUBMITTED: 600} and h.status(job) == S.SUBMITTED


@pytest.mark.parametrize("keep_going", [True, False])
def test_failures_of_every_part_are_counted_once_at_the_end(keep_going: bool) -> None:
    h = Harness()
    job, send = start(h, keep_going=keep_going)
    assert not part(h, send, 0, 500, more=True, rejected=((3, "full"),)).of(Reply)
    error = reply(part(h, send, 500, N, more=False, rejected=((7, "full"),))).error
    assert (error is None) is keep_going
    if error is not None:
        assert "2 subjob(s) failed to submit; first, 0.3: full" in str(error)
    assert h.sm.statuses(job)[3] == h.sm.statuses(job)[507] == S.FAILED.code  # native: refused is failed


def test_a_master_nothing_of_which_went_out_in_any_part_is_rolled_back() -> None:
    h = Harness()
    job, send = start(h, native=False, keep_going=False)
    part(h, send, 0, 500, more=True, rejected=((0, "down"),), not_attempted=tuple(range(1, 500)), native=False)
    error = reply(part(h, send, 500, N, more=False, not_attempted=tuple(range(500)), native=False)).error
    assert error is not None and "no subjob could be submitted; first error: down" in str(error)
    assert h.status(job) == S.NEW and h.sm.n_subjobs(job) == 0


def test_a_whole_slice_moves_as_run_by_run_would() -> None:
    h = Harness()
    job, send = start(h)
    h.tick()
    step = h.outcomes(send)
    assert [(c.old, c.new, len(c)) for c in step.changes if c.indexes is not None] == [(S.SUBMITTING, S.SUBMITTED, N)]
    assert {h.sm.info((job, i))["timestamps"]["submitted"] for i in (0, 500, N - 1)} == {h.clock}
    h.tick()
    h.report(job, array("q", range(0, N, 2)), S.RUNNING)  # not contiguous: every other run
    h.report(job, range(N), S.COMPLETED)  # mixed statuses: run by run
    assert h.sm.counts(job) == {S.COMPLETED: N} and h.status(job) == S.COMPLETED
    assert h.sm.info((job, 2))["timestamps"]["running"] == h.clock and "running" not in h.sm.info((job, 1))[
        "timestamps"]
    assert all(h.sm.attempt((job, i)) == 1 for i in (0, 1, N - 1))


def test_a_run_named_twice_in_a_large_report_is_moved_once() -> None:
    h = Harness()
    job, send = start(h)
    h.outcomes(send)
    twice = array("q", [*range(300), 5])
    h.report(job, twice, S.RUNNING)
    assert h.sm.counts(job) == {S.RUNNING: 300, S.SUBMITTED: N - 300}


def test_a_large_batch_the_table_forbids_is_refused_run_by_run() -> None:
    h = Harness()
    job, send = start(h)
    h.outcomes(send)
    h.report(job, range(N), S.COMPLETED)
    step = h.report(job, range(N), S.RUNNING)  # completed -> running: illegal, recorded for each run
    assert len(step.refusals) == N and h.sm.counts(job) == {S.COMPLETED: N}
