"""The analyser's classification table and retry limits, without a loop or a disk."""

from __future__ import annotations

import pytest

from orchestrator.core.analyser import Limits, Outcome, classify, decide
from orchestrator.core.runlog import parse_log
from orchestrator.core.statuses import JobStatus

S = JobStatus
LIMITS = Limits(max_early=2, max_late_handled=3, max_late_unhandled=1, early_seconds=10)


def log(*lines: str) -> str:
    return "\n".join(lines) + "\n"


FAILED_RUN = Outcome(S.FAILED, exit_code=1)


@pytest.mark.parametrize(("outcome", "text", "expected"), [
    # level orchestrator / backend
    (Outcome(S.FAILED, backend_verdict="lost"), "", ("orchestrator", "late_unhandled", None)),
    (Outcome(S.FAILED, backend_verdict="aborted"), "", ("backend", "late_unhandled", None)),
    (Outcome(S.HELD, backend_verdict="cancelled"), "", ("backend", "hold", S.HELD)),
    (Outcome(S.KILLED), "", ("backend", "killed", S.KILLED)),
    # batch: no log, or no start line
    (FAILED_RUN, "", ("batch", "early", None)),
    (FAILED_RUN, log("100 INFO hello"), ("batch", "early", None)),
    # worker: start, no end
    (FAILED_RUN, log("100 START 1"), ("worker", "early", None)),
    (FAILED_RUN, log("100 START 1", "200 INFO still here"), ("worker", "late_unhandled", None)),
    # application: non-zero exit without keyword, by run time
    (FAILED_RUN, log("100 START 1", "101 EXIT 3", "101 END 3"), ("application", "early", None)),
    (FAILED_RUN, log("100 START 1", "150 EXIT 3", "150 END 3"), ("application", "late_unhandled", None)),
    (FAILED_RUN, log("100 START 1", "150 RETRY 1", "150 FAILED x", "150 EXIT 0", "150 END 0"),
     ("application", "late_unhandled", None)),
    (FAILED_RUN, log("100 START 1", "101 SUCCEEDED", "101 EXIT 0", "101 END 0"), ("application", "early", None)),
    # a plain executable that exits 0 has succeeded
    (Outcome(S.COMPLETED, exit_code=0), log("100 START 1", "101 EXIT 0", "101 END 0"),
     ("application", "success", S.COMPLETED)),
    # user
    (FAILED_RUN, log("100 START 1", "101 SUCCEEDED out.txt", "101 EXIT 1", "101 END 1"),
     ("user", "success", S.COMPLETED)),
    (FAILED_RUN, log("100 START 1", "101 FAILED bad input", "101 EXIT 1", "101 END 1"), ("user", "failed", S.FAILED)),
    (FAILED_RUN, log("100 START 1", "101 HOLD disk full", "101 EXIT 0", "101 END 0"), ("user", "early", S.HELD)),
    (FAILED_RUN, log("100 START 1", "101 RETRY 3", "101 EXIT 0", "101 END 0"), ("user", "early", None)),
    (FAILED_RUN, log("100 START 1", "190 RETRY 3", "190 EXIT 0", "190 END 0"), ("user", "late_handled", None)),
])
def test_classification_table(outcome: Outcome, text: str, expected: tuple[str, str, JobStatus | None]) -> None:
    level, verdict, _reason, status, _data = classify(outcome, parse_log(text), LIMITS)
    assert (level, verdict, status) == expected


def test_garbage_log_lines_are_not_a_crash() -> None:
    parsed = parse_log("nonsense\n\x00\x01 START\n12x END 0\n100 START\n100 END notanumber\n")
    level, verdict, _, status, _ = classify(FAILED_RUN, parsed, LIMITS)
    assert status is None and level in ("worker", "application")


def test_succeeded_keeps_its_data_as_outputs() -> None:
    d = decide(FAILED_RUN, parse_log(log("1 START 1", "2 SUCCEEDED a.root b.root", "2 EXIT 0", "2 END 0")),
               LIMITS, {}, ["x"])
    assert d.status == S.COMPLETED and d.outputs == ("a.root", "b.root") and not d.retry


def test_retry_passes_the_applications_args_and_reuses_them_below_user_level() -> None:
    retry = decide(FAILED_RUN, parse_log(log("1 START 1", "2 RETRY 3 b", "2 EXIT 0", "2 END 0")), LIMITS, {}, [])
    assert retry.retry and retry.retry_args == ("3", "b") and retry.counters == {"early": 1}
    crash = decide(FAILED_RUN, parse_log(log("1 START 1")), LIMITS, retry.counters, retry.retry_args)
    assert crash.retry and crash.retry_args == ("3", "b") and crash.counters == {"early": 2}


@pytest.mark.parametrize(("text", "verdict", "limit"), [
    (log("1 START 1", "2 EXIT 1", "2 END 1"), "early", "max_early"),
    (log("1 START 1", "90 RETRY 1", "90 EXIT 0", "90 END 0"), "late_handled", "max_late_handled"),
    (log("1 START 1", "90 EXIT 1", "90 END 1"), "late_unhandled", "max_late_unhandled"),
])
def test_each_limit_is_enforced_on_its_own(text: str, verdict: str, limit: str) -> None:
    counters: dict[str, int] = {}
    allowed = getattr(LIMITS, limit)
    for _ in range(allowed):
        d = decide(FAILED_RUN, parse_log(text), LIMITS, counters, [])
        assert d.retry and d.limit_reached is None
        counters = d.counters
    d = decide(FAILED_RUN, parse_log(text), LIMITS, counters, [])
    assert not d.retry and d.status == S.FAILED and d.limit_reached == limit and d.verdict == verdict
    assert limit in d.reason
    entry = d.history_entry(5.0, 1, 3)
    assert entry["limit"] == limit and entry["action"] == "failed"


def test_all_zero_limits_turn_retries_off() -> None:
    off = Limits(0, 0, 0, 60)
    d = decide(FAILED_RUN, parse_log(log("1 START 1", "2 EXIT 1", "2 END 1")), off, {}, [])
    assert not d.retry and d.status == S.FAILED and d.reason == "exit code 1 without a terminal keyword"


def test_limits_resolve_from_policy_then_defaults() -> None:
    defaults = {"max_early": 5, "max_late_handled": 6, "max_late_unhandled": 7, "early_seconds": 60.0}
    limits = Limits.resolve({"max_early": 0, "max_late_handled": None}, defaults)
    assert limits == Limits(0, 6, 7, 60.0)
