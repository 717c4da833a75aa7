"""The core's small value modules, each rule pinned: ids and batches (``ids``), statuses (``statuses``), the wrapper's
log (``runlog``), the attempts' CPU records (``usage``). Written to kill what mutation testing found alive
(docs/testing-mutation.md)."""

from __future__ import annotations

from array import array

import pytest

from orchestrator.core.ids import Runs, as_range, fqid_str, parse_fqid, parse_fqid_or_none
from orchestrator.core.runlog import RunLog, parse_log
from orchestrator.core.statuses import ALL_STATUSES, JobStatus, allowed, master_status, parse_status
from orchestrator.core.usage import MOST_RECORDS, Attempt, Tally, judge, parse_usage, tally

S = JobStatus


# ------------------------------------------------------------------ ids
@pytest.mark.parametrize("value, expected", [(3, (3,)), (0, (0,)), ("3.1", (3, 1)), (" 4.0.2 ", (4, 0, 2)),
                                             ((3, 1), (3, 1)), ([5], (5,))])
def test_parse_fqid_takes_every_form(value: object, expected: tuple[int, ...]) -> None:
    assert parse_fqid(value) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [True, False, -1, "", "3.", "a.1", "3.-1", (), [], (1, True), ("1",), 3.0, None,
                                   (1, -2)])
def test_parse_fqid_refuses_the_rest_naming_it(value: object) -> None:
    with pytest.raises(ValueError, match="not a job id") as raised:
        parse_fqid(value)  # type: ignore[arg-type]
    assert repr(value) in str(raised.value)


def test_parse_fqid_says_what_a_string_should_look_like() -> None:
    with pytest.raises(ValueError, match=r"^not a job id: 'x' \(expected e\.g\. '3' or '3\.1'\)$"):
        parse_fqid("x")


def test_fqid_str_and_the_lenient_parser() -> None:
    assert fqid_str((3,)) == "3" and fqid_str((3, 1)) == "3.1" and fqid_str((1, 2, 3)) == "1.2.3"
    assert parse_fqid_or_none("3.1") == (3, 1) and parse_fqid_or_none("7") == (7,)
    assert parse_fqid_or_none("0.0") == (0, 0)
    for bad in (None, 3, "", "x", "3.x", "-1", "3.-1", b"3"):
        assert parse_fqid_or_none(bad) is None


def test_runs_of_keeps_consecutive_indexes_as_a_range() -> None:
    assert Runs.of(3, None).indexes is None and Runs.of(3, None).whole
    r = range(2, 5)
    assert Runs.of(3, r).indexes is r
    assert Runs.of(3, [4, 5, 6]).indexes == range(4, 7)
    assert Runs.of(3, array("q", [4, 5, 6])).indexes == range(4, 7)
    scattered = Runs.of(3, [1, 5, 6])
    assert isinstance(scattered.indexes, array) and list(scattered.indexes) == [1, 5, 6]
    kept = array("q", [9, 2])
    assert Runs.of(1, kept).indexes is kept  # an array is used as it is
    assert Runs.of(1, iter([7, 8])).indexes == range(7, 9)


def test_runs_as_a_batch() -> None:
    whole, some = Runs(3), Runs(3, [1, 4])
    assert len(whole) == 1 and bool(whole) and whole.whole and list(whole) == [(3,)]
    assert len(some) == 2 and not some.whole and list(some) == [(3, 1), (3, 4)] and some.fqids() == ((3, 1), (3, 4))
    assert not Runs(3, []) and len(Runs(3, [])) == 0
    assert Runs(3, [1, 2]) == Runs(3, range(1, 3)) and Runs(3) == Runs(3)
    assert Runs(3, [1]) != Runs(4, [1]) and Runs(3, [1]) != Runs(3, [2]) and Runs(3) != Runs(3, [0])
    assert Runs(3, [0]) != Runs(3) and Runs(3, [1, 2]) != Runs(3, [1])
    assert Runs(3).__eq__("3") is NotImplemented
    assert hash(Runs(3, [1, 2])) == hash(Runs(3, range(1, 3)))
    assert repr(Runs(3)) == "Runs(3)" and repr(Runs(3, range(0, 5))) == "Runs(3.[0..4])"
    assert repr(Runs(3, [1, 4])) == "Runs(3.[1,4])"
    assert repr(Runs(2, list(range(0, 20, 2)))) == "Runs(2.[0,2,4,6,8,10,12,14,... (10)])"


def test_as_range() -> None:
    assert as_range(range(3, 6)) == range(3, 6) and as_range(range(0, 6, 2)) is None
    assert as_range([3, 4, 5]) == range(3, 6) and as_range(array("q", [3, 4, 5])) == range(3, 6)
    assert as_range([7]) == range(7, 8)
    assert as_range([]) is None and as_range([3, 5, 4]) is None and as_range([3, 5]) is None
    assert as_range([1, 1, 3]) is None  # length and ends agree, the middle does not
    assert as_range([5, 4, 3]) is None


# ------------------------------------------------------------------ statuses
def test_status_codes_round_trip_and_names_parse() -> None:
    assert [s.code for s in ALL_STATUSES] == list(range(len(ALL_STATUSES)))
    assert all(JobStatus.from_code(s.code) is s for s in ALL_STATUSES)
    assert parse_status("failed") is S.FAILED and parse_status(S.HELD) is S.HELD
    with pytest.raises(ValueError, match=r"unknown status 'fail' \(expected one of: new, submitting, .*, held\)"):
        parse_status("fail")


def test_the_transition_table() -> None:
    assert allowed(S.NEW, S.SUBMITTING) and not allowed(S.NEW, S.RUNNING)
    assert allowed(S.HELD, S.KILLED) and not allowed(S.COMPLETED, S.FAILED)
    assert allowed(S.SUBMITTING, S.NEW) and not allowed(S.COMPLETING, S.KILLED)


@pytest.mark.parametrize("counts, submitted_first, running_first", [
    ({S.SUBMITTED: 1, S.RUNNING: 1}, S.SUBMITTED, S.RUNNING),
    ({S.SUBMITTING: 1, S.COMPLETING: 1}, S.SUBMITTED, S.RUNNING),
    ({S.SUBMITTED: 2}, S.SUBMITTED, S.SUBMITTED),
    ({S.RUNNING: 1, S.FAILED: 3}, S.RUNNING, S.RUNNING),
    ({S.HELD: 1, S.FAILED: 1}, S.HELD, S.HELD),
    ({S.NEW: 1, S.COMPLETED: 1}, S.FAILED, S.FAILED),
    ({S.FAILED: 1, S.COMPLETED: 5}, S.FAILED, S.FAILED),
    ({S.COMPLETED: 1, S.KILLED: 1}, S.COMPLETED, S.COMPLETED),
    ({S.KILLED: 2}, S.KILLED, S.KILLED),
    ({S.KILLED: 2, S.RUNNING: 0, S.FAILED: 0}, S.KILLED, S.KILLED),
])
def test_master_status_rules(counts: dict[JobStatus, int], submitted_first: JobStatus,
                             running_first: JobStatus) -> None:
    assert master_status(counts) is submitted_first
    assert master_status(counts, "submitted-first") is submitted_first
    assert master_status(counts, "running-first") is running_first


def test_master_status_order_is_checked() -> None:
    with pytest.raises(ValueError, match="master_status_order must be one of .* not 'x'"):
        master_status({S.KILLED: 1}, "x")


# ------------------------------------------------------------------ runlog
def test_parse_log_reads_every_line() -> None:
    log = parse_log("10.5 START 42\n11 INFO reading input\n12.25 SUCCEEDED out.txt more\n"
                    "12.5 RETURN_FILE a b\n13 EXIT 0\n14.75 END 0\n")
    assert log.started == 10.5 and log.exit_code == 0 and log.ended == 14.75 and log.end_code == 0
    assert log.finished
    assert log.keywords == [(11.0, "INFO", "reading input"), (12.25, "SUCCEEDED", "out.txt more"),
                            (12.5, "RETURN_FILE", "a b")]


def test_parse_log_skips_what_is_malformed() -> None:
    log = parse_log("garbage\nx START 1\n5 START\n6 EXIT oops\n7 END 3 extra\n8 HOLD\n")
    assert log.started == 5.0 and log.exit_code is None and log.end_code == 3 and log.ended == 7.0
    assert log.keywords == [(8.0, "HOLD", "")]
    assert parse_log("") == RunLog() and not RunLog().finished
    assert parse_log("1 START 2\n").end_code is None and not parse_log("1 START 2\n").finished
    assert parse_log("1 END\n").end_code is None and parse_log("1 END\n").ended == 1.0
    assert parse_log("1  START\n").keywords == [(1.0, "", "START")]  # words are split on one space
    assert parse_log("2 EXIT 7\n").exit_code == 7 and parse_log("2 EXIT\n").exit_code is None


# ------------------------------------------------------------------ usage
RECORDS = ("1 0 0 100.0 101.5 143\n0m0.010000s 0m0.020000s\n0m0.300000s 0m0.070000s\n"
           "2 0 7 102.0 104.0 143\n0m0.000000s 0m0.000000s\n1m0.500000s 0m0.500000s\n"
           "3 7 9 105.0 105.25 0\n0m0.100000s 0m0.000000s\n0m0.000000s 0m0.000000s\n")


def test_parse_usage_reads_each_record() -> None:
    got = parse_usage(RECORDS)
    assert [(a.attempt, a.started_from, a.newest, a.start, a.end, a.code) for a in got] == \
        [(1, 0, 0, 100.0, 101.5, 143), (2, 0, 7, 102.0, 104.0, 143), (3, 7, 9, 105.0, 105.25, 0)]
    assert [a.cpu for a in got] == pytest.approx([0.4, 61.0, 0.1])
    assert [a.wall for a in got] == [1.5, 2.0, 0.25]
    assert Attempt(1, 0, 0, 5.0, 4.0, 0, 0.0).wall == 0.0  # a clock that went back: never negative


def test_parse_usage_skips_a_torn_record() -> None:
    torn = "garbage\n" + RECORDS + "4 9 9 106.0"
    assert [a.attempt for a in parse_usage(torn)] == [1, 2, 3]
    assert parse_usage("1 0 0 1 2 0\n0m0s 0m0s\n") == []  # no children's line
    assert [a.cpu for a in parse_usage("1 0 0 1 2 0\n0m0s 0m0s\n0m1s\n")] == [1.0]  # a short line: what it has


@pytest.mark.parametrize("own, start", [("-1m0.0s 0m0s", "1"), ("0m-5.0s 0m0s", "1"), ("infm0s 0m0s", "1"),
                                        ("0mnans 0m0s", "1"), ("1e308m0s 0m0s", "1"), ("0m1s 0m0s", "nan"),
                                        ("0m1s 0m0s", "inf"), ("1e306m0s 0m0s", "1")])
def test_parse_usage_skips_a_record_whose_times_are_no_times(own: str, start: str) -> None:
    """The file is in the run's output dir, which the run may write to: a negative, NaN or infinite time made
    Prometheus' CPU counter raise (the service stopped) or stay infinite; such a record is skipped."""
    assert [a.attempt for a in parse_usage(f"7 0 0 {start} 2 0\n{own}\n0m0s 0m0s\n" + RECORDS)] == [1, 2, 3]


def test_parse_usage_keeps_the_last_records_only() -> None:
    """Judging compares each record with each: a run that wrote a hundred thousand records of its own stalled the
    CPU metrics (and ``report``). The last ``MOST_RECORDS`` are kept."""
    record = "{} 0 0 1 2 0\n0m1s 0m0s\n0m0s 0m0s\n"
    got = parse_usage("".join(record.format(n) for n in range(1, MOST_RECORDS + 11)))
    assert [a.attempt for a in got] == list(range(11, MOST_RECORDS + 11))


def test_parse_log_skips_a_line_whose_time_is_no_time() -> None:
    """The run may write its log too: a ``nan START`` made a master's start time NaN for good (the least of its
    subjobs'), and listing it then failed for everyone."""
    log = parse_log("5.0 START 1 h\nnan START 2 x\n-1e308 START 3 y\ninf END 0\n1e300 EXIT 1\n6.0 END 0\n")
    assert (log.started, log.host, log.ended, log.end_code, log.exit_code) == (5.0, "h", 6.0, 0, None)


def test_judge_useful_resumed_and_wasted_by_cause() -> None:
    attempts = parse_usage(RECORDS)
    history = [{"attempt": 1, "level": "worker", "verdict": "early"}, {"attempt": 2, "verdict": "refused"}]
    assert [c for _, c in judge(attempts, history)] == ["worker: early", None, None]  # 2 was resumed from (7)
    assert [c for _, c in judge(attempts[:2], history)] == ["worker: early", "killed"]  # nobody resumed from 2 yet
    alone = [Attempt(1, 0, 0, 0.0, 1.0, 3, 1.0), Attempt(2, 0, 0, 0.0, 1.0, 128, 1.0),
             Attempt(3, 0, 0, 0.0, 1.0, 127, 1.0)]
    assert [c for _, c in judge(alone, [{"attempt": 9, "level": "x"}])] == ["exit code 3", "killed", "exit code 127"]
    assert [c for _, c in judge(alone[:1], [{"attempt": 1}])] == ["?: ?"]
    # resumed from: only a later attempt that started from a state this one saved (after its own start)
    early = Attempt(1, 2, 5, 0.0, 1.0, 1, 1.0)
    for later, useful in ((Attempt(2, 5, 5, 0, 1, 0, 1), True), (Attempt(2, 3, 5, 0, 1, 0, 1), True),
                          (Attempt(2, 2, 5, 0, 1, 0, 1), False), (Attempt(2, 6, 6, 0, 1, 0, 1), False)):
        assert (judge([early, later], ())[0][1] is None) is useful, later
    assert judge([Attempt(2, 0, 4, 0, 1, 1, 1), Attempt(1, 2, 2, 0, 1, 1, 1)], ())[0][1] == "exit code 1"


def test_tally_adds_up_as_the_report_does() -> None:
    attempts = parse_usage(RECORDS)
    t = tally(attempts, [{"attempt": 1, "level": "worker", "verdict": "early"}])
    assert t.attempts == 3 and t.wall == pytest.approx(3.75)
    assert t.useful == pytest.approx(61.1) and t.wasted == pytest.approx(0.4) and t.cpu == pytest.approx(61.5)
    assert t.by_cause == {"worker: early": pytest.approx(0.4)}
    both = Tally().add(attempts[:1]).add(attempts[:1])
    assert both.attempts == 2 and both.by_cause == {"killed": pytest.approx(0.8)} and both.useful == 0.0
    assert tally([]) == Tally() and Tally().cpu == 0.0


def test_the_edges_mutation_testing_found() -> None:
    assert Runs.of(3, None).job == 3 and Runs.of(3, range(1, 2)).job == 3 and Runs.of(3, [1, 5]).job == 3
    assert Runs.of(3, [1, 2]).job == 3
    assert hash(Runs(3)) == hash(Runs(3)) and hash(Runs(3, [1, 2])) != hash(Runs(4, [1, 2]))
    assert hash(Runs(3)) != hash(Runs(3, [0, 1]))
    eight, nine = list(range(0, 16, 2)), list(range(0, 18, 2))
    assert repr(Runs(1, eight)) == "Runs(1.[0,2,4,6,8,10,12,14])"
    assert repr(Runs(1, nine)) == "Runs(1.[0,2,4,6,8,10,12,14,... (9)])"
    wasted = [Attempt(1, 0, 0, 0.0, 1.0, 1, 0.25), Attempt(2, 0, 0, 0.0, 1.0, 1, 0.5)]
    assert tally(wasted).wasted == 0.75 and tally(wasted).by_cause == {"exit code 1": 0.75}
    both = parse_usage("1 0 0 1 2 0\n0m1s 0m2s 0m4s\n0m8s 0m16s 0m32s\n")
    assert [a.cpu for a in both] == [27.0]  # user and system time only, of each line
