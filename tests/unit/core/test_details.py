"""Details of the core's data: fully qualified ids, a master's timestamps, counters that never rescan."""

from __future__ import annotations

import pytest

from orchestrator.core.ids import Runs, fqid_str, parse_fqid
from orchestrator.core.statuses import JobStatus

from .harness import Harness, profile

S = JobStatus


@pytest.mark.parametrize(("value", "expected"), [(3, (3,)), ("3", (3,)), ("3.1", (3, 1)), (" 12.0 ", (12, 0)),
                                                 ((3, 1), (3, 1)), ([3, 1], (3, 1)), ("12.0.4", (12, 0, 4))])
def test_parse_fqid(value: object, expected: tuple[int, ...]) -> None:
    assert parse_fqid(value) == expected  # type: ignore[arg-type]
    assert parse_fqid(fqid_str(expected)) == expected


@pytest.mark.parametrize(
    "value",
    [-1, "", "3.", ".1", "3..1", "a", "3.x", "-3", "3.-1", (), [], (3, "1"), [3.0], (True,), True, None, 3.5, {3}],
)
def test_parse_fqid_rejects(value: object) -> None:
    with pytest.raises(ValueError, match="not a job id"):
        parse_fqid(value)  # type: ignore[arg-type]


def test_runs_keep_consecutive_indexes_as_a_range() -> None:
    assert isinstance(Runs.of(3, [4, 5, 6]).indexes, range)
    assert list(Runs.of(3, [4, 6]).indexes or ()) == [4, 6]
    assert list(Runs(3, range(2))) == [(3, 0), (3, 1)] and list(Runs(3)) == [(3,)]


def test_a_masters_start_times_are_its_earliest_subjobs_and_end_times_its_latest() -> None:
    h = Harness()
    h.clock = 5.0
    job = h.add(profile())
    h.submit_all(job, 3)  # all submitting at 5, submitted at 5
    h.clock = 25.0
    h.report(job, [1], S.RUNNING)
    h.clock = 30.0
    h.report(job, [0], S.RUNNING)
    h.clock = 40.0
    h.report(job, [0], S.COMPLETED)
    h.clock = 50.0
    h.report(job, [1], S.FAILED)
    h.clock = 35.0
    h.report(job, [2], S.COMPLETED)
    stamps = h.sm.info((job,))["timestamps"]
    assert (stamps["submitting"], stamps["submitted"], stamps["running"]) == (5.0, 5.0, 25.0)
    assert (stamps["completed"], stamps["failed"], stamps["final"]) == (40.0, 50.0, 50.0)


def test_moving_a_hundred_thousand_subjobs_counts_and_never_rescans() -> None:
    n = 100_000
    h = Harness(validate=False)  # validate_state scans the statuses: only the core's own reads are counted
    job = h.add(profile())
    h.submit_all(job, n)
    table = h.sm.job_state(job).runs
    scans = []

    class Counting(bytearray):
        def __iter__(self):  # type: ignore[no-untyped-def]
            scans.append(1)
            return super().__iter__()

        def count(self, *args):  # type: ignore[no-untyped-def]
            scans.append(1)
            return super().count(*args)

    table.status = Counting(table.status)
    h.report(job, [500], S.RUNNING)
    assert h.status(job) == S.SUBMITTED and h.sm.counts(job) == {S.SUBMITTED: n - 1, S.RUNNING: 1}
    step = h.report(job, list(range(n)), S.RUNNING)  # one bulk report, one re-derivation of the master
    assert [c.new for c in step.changes if c.indexes is None] == [S.RUNNING]
    assert scans == [] and h.sm.counts(job) == {S.RUNNING: n}
