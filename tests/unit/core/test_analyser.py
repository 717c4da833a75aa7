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
    assert crash.retry and crash.retry_args == ("3", "b")
    assert crash.counters == {"early": 1, "infrastructure:early": 1}  # the worker's crash is counted apart


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
    assert limits == Limits(0, 6, 7, 60.0)  # max_infrastructure absent everywhere: -1, as the three limits
    assert Limits.resolve({"max_infrastructure": 2}, {**defaults, "max_infrastructure": -1}).max_infrastructure == 2


# ------------------------------------------------------------ the infrastructure's own budget
WORKER_CRASH = log("1 START 1")  # started, never ended: worker level, early
BATCH_LOSS = ""  # no log at all: batch level, early


@pytest.mark.parametrize("text", [WORKER_CRASH, BATCH_LOSS])
def test_infrastructure_faults_never_use_up_the_users_limits(text: str) -> None:
    """With max_infrastructure set, a fault outside the job is retried within it alone, whatever the user's
    three limits say (all zeros here), and the user's counters stay untouched."""
    limits = Limits(0, 0, 0, 10, max_infrastructure=2)
    counters: dict[str, int] = {}
    for n in (1, 2):
        d = decide(FAILED_RUN, parse_log(text), limits, counters, [])
        assert d.retry and d.level in ("worker", "batch") and d.verdict == "early"
        assert d.counters == {"infrastructure:early": n}
        counters = d.counters
    d = decide(FAILED_RUN, parse_log(text), limits, counters, [])
    assert not d.retry and d.limit_reached == "max_infrastructure" and "max_infrastructure=2" in d.reason


def test_infrastructure_budget_is_shared_by_every_verdict_and_level() -> None:
    limits = Limits(0, 0, 0, 10, max_infrastructure=2)
    lost = decide(Outcome(S.FAILED, backend_verdict="lost"), parse_log(""), limits, {}, [])
    assert lost.retry and lost.counters == {"infrastructure:late_unhandled": 1}
    crash = decide(FAILED_RUN, parse_log(WORKER_CRASH), limits, lost.counters, [])
    assert crash.retry and crash.counters == {"infrastructure:late_unhandled": 1, "infrastructure:early": 1}
    third = decide(Outcome(S.FAILED, backend_verdict="aborted"), parse_log(""), limits, crash.counters, [])
    assert not third.retry and third.limit_reached == "max_infrastructure"


def test_the_users_limits_still_bound_the_applications_failures_after_infrastructure_faults() -> None:
    """Two worker crashes do not shorten what max_early allows the application's own early failures."""
    limits = Limits(1, 0, 0, 10, max_infrastructure=5)
    counters: dict[str, int] = {}
    for _ in range(2):
        counters = decide(FAILED_RUN, parse_log(WORKER_CRASH), limits, counters, []).counters
    app = log("1 START 1", "2 EXIT 1", "2 END 1")
    first = decide(FAILED_RUN, parse_log(app), limits, counters, [])
    assert first.retry and first.counters["early"] == 1
    second = decide(FAILED_RUN, parse_log(app), limits, first.counters, [])
    assert not second.retry and second.limit_reached == "max_early"


def test_unset_infrastructure_budget_follows_each_verdicts_limit_counted_apart() -> None:
    """max_infrastructure < 0 (the default): a batch fault is bounded by max_early, yet counted apart, so
    the application keeps all of its own max_early; all zeros still turns every retry off."""
    limits = Limits(1, 0, 0, 10)
    batch = decide(FAILED_RUN, parse_log(BATCH_LOSS), limits, {}, [])
    assert batch.retry and batch.counters == {"infrastructure:early": 1}
    again = decide(FAILED_RUN, parse_log(BATCH_LOSS), limits, batch.counters, [])
    assert not again.retry and again.limit_reached == "max_early"
    app = decide(FAILED_RUN, parse_log(log("1 START 1", "2 EXIT 1", "2 END 1")), limits, batch.counters, [])
    assert app.retry and app.counters == {"infrastructure:early": 1, "early": 1}
    off = decide(FAILED_RUN, parse_log(BATCH_LOSS), Limits(0, 0, 0, 10), {}, [])
    assert not off.retry and off.limit_reached == "max_early"


# ------------------------------------------------------------ fail_on_missing_output
def test_an_unmatched_output_pattern_fails_a_run_that_would_succeed() -> None:
    text = log("100 START 1", "101 EXIT 0", "101 NOMATCH *.root", "101 NOMATCH out.txt", "101 END 0")
    level, verdict, reason, status, _ = classify(Outcome(S.COMPLETED, exit_code=0), parse_log(text), LIMITS)
    assert (level, verdict, status) == ("application", "early", None)
    assert reason == "output file patterns '*.root', 'out.txt' matched nothing"
    late = log("100 START 1", "150 SUCCEEDED x", "150 EXIT 0", "150 NOMATCH *.root", "150 END 0")
    level, verdict, reason, status, _ = classify(Outcome(S.COMPLETED, exit_code=0), parse_log(late), LIMITS)
    assert (level, verdict, status) == ("application", "late_unhandled", None)
    assert reason == "output file pattern '*.root' matched nothing"


def test_missing_output_is_ignored_when_turned_off_or_when_the_run_failed_anyway() -> None:
    text = log("100 START 1", "101 EXIT 0", "101 NOMATCH *.root", "101 END 0")
    ok = classify(Outcome(S.COMPLETED, exit_code=0), parse_log(text), LIMITS, missing_output_fails=False)
    assert ok[3] == S.COMPLETED
    failed = log("100 START 1", "101 EXIT 4", "101 NOMATCH *.root", "101 END 4")
    assert classify(FAILED_RUN, parse_log(failed), LIMITS)[2] == "exit code 4 without a terminal keyword"
