"""Per-run arrays (``table``), a job's own state (``jobs``) and the analyser's clock: each rule pinned, written to
kill what mutation testing found alive (docs/testing-mutation.md)."""

from __future__ import annotations

from array import array

from orchestrator.core.analyser import Limits, Outcome, classify
from orchestrator.core.events import Profile
from orchestrator.core.jobs import JobState
from orchestrator.core.runlog import parse_log
from orchestrator.core.statuses import JobStatus
from orchestrator.core.table import RunExtra, RunTable

S = JobStatus


def test_a_restored_table_is_the_one_stored() -> None:
    status = bytearray([S.COMPLETED.code, S.RUNNING.code, S.FAILED.code])
    times = {"running": array("d", [1.0, 2.0, 3.0]).tobytes(), "final": array("d", [5.0, 0.0, 6.0]).tobytes()}
    extras = {2: RunExtra(reason="boom", timestamps={"failed": 6.0})}
    table = RunTable.restore(status, [1, 2, 3], {k: array("d", v) for k, v in times.items()}, extras)
    assert len(table) == 3 and table.get(1) is S.RUNNING
    assert isinstance(table.attempt, array) and table.attempt.typecode == "I" and list(table.attempt) == [1, 2, 3]
    assert list(table.times["running"]) == [1.0, 2.0, 3.0] and list(table.times["submitted"]) == [0.0, 0.0, 0.0]
    assert table.times["submitted"].typecode == "d" and table.extras is extras
    assert table.counts[S.COMPLETED.code] == table.counts[S.RUNNING.code] == table.counts[S.FAILED.code] == 1
    assert table.timestamps(0) == {"running": 1.0, "final": 5.0, "completed": 5.0}
    assert table.timestamps(1) == {"running": 2.0}  # not final: no final time
    assert table.timestamps(2) == {"running": 3.0, "failed": 6.0, "final": 6.0}
    assert table.time_of(0, "running") == 1.0 and table.time_of(1, "final") is None
    assert table.time_of(2, "failed") == 6.0 and table.time_of(0, "failed") is None


def test_a_final_time_names_the_final_status_only() -> None:
    table = RunTable(2)
    table.status[0] = S.HELD.code
    table.times["final"][0] = 7.0  # a run held after an earlier end keeps that final time, not as "held"
    table.status[1] = S.KILLED.code
    table.times["final"][1] = 8.0
    table.extra(1).timestamps["killed"] = 9.0  # its own record wins over the final time
    assert table.timestamps(0) == {"final": 7.0}
    assert table.timestamps(1) == {"final": 8.0, "killed": 9.0}


def test_run_extra_keeps_only_its_fields() -> None:
    extra = RunExtra.from_dict({"reason": "r", "counters": {"early": 1}, "unknown": 3})
    assert extra.reason == "r" and extra.counters == {"early": 1} and extra.to_dict() == {"reason": "r",
                                                                                         "counters": {"early": 1}}
    assert RunExtra().to_dict() == {}


def test_what_makes_a_job_active() -> None:
    single = JobState(0, Profile("sim"), 100.0)
    assert not single.active()
    single.runs.status[0] = S.SUBMITTED.code
    assert single.active()
    single.runs.status[0] = S.COMPLETED.code
    assert not single.active()
    single.postprocessing = True
    assert single.active() and not single.active(postprocess=False)

    master = JobState(1, Profile("sim"), 100.0)
    master.split(3)
    assert master.is_master is True and not master.active()
    master.pinned = S.SUBMITTING  # a submission under way stands for its subjobs
    assert master.active()
    master.pinned = S.HELD
    assert not master.active()
    master.pinned = None
    master.runs.status[1] = S.RUNNING.code
    master.runs.counts[S.NEW.code] -= 1
    master.runs.counts[S.RUNNING.code] += 1
    assert master.active()  # one active subjob is enough


def test_unsplit_is_a_new_job_without_subjobs_again() -> None:
    js = JobState(2, Profile("sim"), 100.0)
    js.split(4)
    js.pinned = S.SUBMITTING
    js.top.timestamps["submitting"] = 101.0
    js.unsplit()
    assert len(js.runs) == 1 and js.is_master is False and js.pinned is None and js.status is S.NEW
    assert js.top.timestamps == {"new": 100.0}


def test_early_means_strictly_less_than_early_seconds_by_the_logs_clock() -> None:
    limits = Limits(0, 0, 0, 60.0)
    failed = Outcome(S.FAILED, 3)
    for end, verdict in ((59.5, "early"), (60.0, "late_unhandled"), (61.0, "late_unhandled")):
        log = parse_log(f"0 START 1\n{end} EXIT 3\n{end} END 3\n")
        assert classify(failed, log, limits, seconds=1.0)[1] == verdict, end
    started = parse_log("0 START 1\n")  # no end, no keyword: the caller's clock
    assert classify(failed, started, limits, seconds=60.0)[1] == "late_unhandled"
    assert classify(failed, started, limits, seconds=59.0)[1] == "early"
    assert classify(failed, started, limits, seconds=None)[1] == "early"
    keyword = parse_log("0 START 1\n70 INFO x\n")  # a keyword's time stands for the end
    assert classify(failed, keyword, limits, seconds=1.0)[1] == "late_unhandled"


def test_a_runs_extras_hold_only_what_was_set_and_read_as_ever() -> None:
    extra = RunExtra(usage=[{"attempt": 1, "cpu": 0.5}])
    # a field never set: nothing stored, nothing made by a peek; read, an empty container of its own
    assert extra.to_dict() == {"usage": [{"attempt": 1, "cpu": 0.5}]}
    assert extra.peek("history") is None and extra.peek("counters") is None and extra.reason is None
    extra.history.append({"verdict": "failed"})
    extra.counters["early"] = 1
    other = RunExtra()
    assert other.history == [] and other.counters == {} and other.checkpoint == {}
    assert extra.to_dict() == {"history": [{"verdict": "failed"}], "counters": {"early": 1},
                               "usage": [{"attempt": 1, "cpu": 0.5}]}
    assert RunExtra.from_dict(extra.to_dict()) == extra
    assert RunExtra.from_dict({"reason": "x", "unknown": 1}).to_dict() == {"reason": "x"}
