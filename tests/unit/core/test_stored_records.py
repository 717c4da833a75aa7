"""What the state machine answers the runtime's writer with: a job's own row, its run arrays, its subjobs' extras
(core.records), read through the machine's narrow reads, never its JobState."""

from __future__ import annotations

from array import array

from orchestrator.core.statuses import JobStatus

from .harness import Harness, limits, profile

S = JobStatus


def test_a_job_that_runs_itself_stores_its_run_in_its_own_info() -> None:
    h = Harness()
    job = h.add(profile(splits=False))
    row = h.sm.stored_job(job)
    assert (row.status, row.n_subjobs, row.created) == ("new", 0, 1000.0)
    assert row.info == {"top": {"timestamps": {"new": 1000.0}}, "attempt": 0, "run": {}}
    assert h.sm.run_infos(job, None) == {}  # its run's extras are in its own row, not a subjob's
    arrays = h.sm.run_arrays(job)
    assert arrays.status == bytes([S.NEW.code]) and array("I", arrays.attempt).tolist() == [0]
    assert set(arrays.times) == {"submitting", "submitted", "running", "final"}


def test_a_master_stores_its_size_its_arrays_and_only_the_extras_that_hold_something() -> None:
    h = Harness()
    m = h.add(profile(limits=limits()))
    h.submit_all(m, 4)
    h.report(m, [1], S.FAILED, exit_code=3)
    row = h.sm.stored_job(m)
    assert (row.status, row.n_subjobs) == ("submitted", 4)
    assert "run" not in row.info and row.info["attempt"] == 1
    arrays = h.sm.run_arrays(m)
    assert [S.from_code(c) for c in arrays.status] == [S.SUBMITTED, S.FAILED, S.SUBMITTED, S.SUBMITTED]
    assert array("I", arrays.attempt).tolist() == [1, 1, 1, 1]
    assert array("d", arrays.times["final"]).tolist()[1] > 0
    infos = h.sm.run_infos(m, None)
    assert list(infos) == [1] and infos[1]["reason"] == "failed"
    assert h.sm.run_infos(m, {0, 2}) == {}  # among the indexes asked for only
    assert list(h.sm.run_infos(m, {0, 1, 2, 3})) == [1]
    assert list(h.sm.run_infos(m, set(range(1000)))) == [1]  # more indexes than extras: the extras are scanned
