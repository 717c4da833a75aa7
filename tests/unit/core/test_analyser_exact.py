"""The analyser's verdicts read whole: every field of a classification and of a decision (core.analyser)."""

from __future__ import annotations

import pytest

from orchestrator.core.analyser import Decision, Limits, Outcome, classify, decide
from orchestrator.core.runlog import RunLog, parse_log
from orchestrator.core.statuses import JobStatus

S = JobStatus
L = Limits(1, 1, 1, 60.0)
NO_LOG = RunLog()


def wrapped(*lines: str) -> RunLog:
    return parse_log("\n".join(lines))


@pytest.mark.parametrize(("outcome", "log", "wrapper", "expected"), [
    (Outcome(S.FAILED, backend_verdict="aborted"), NO_LOG, True,
     ("backend", "late_unhandled", "aborted by the backend", None, ())),
    (Outcome(S.FAILED, reason="r", backend_verdict="aborted"), NO_LOG, True,
     ("backend", "late_unhandled", "r", None, ())),
    (Outcome(S.FAILED, backend_verdict="cancelled"), NO_LOG, True,
     ("backend", "hold", "cancelled by the system", S.HELD, ())),
    (Outcome(S.HELD), NO_LOG, True, ("backend", "hold", "cancelled by the system", S.HELD, ())),
    (Outcome(S.COMPLETED), NO_LOG, False, ("application", "success", "completed", S.COMPLETED, ())),
    (Outcome(S.COMPLETED, reason="done"), NO_LOG, False, ("application", "success", "done", S.COMPLETED, ())),
    (Outcome(S.FAILED), NO_LOG, False, ("application", "early", "failed", None, ())),
    (Outcome(S.FAILED), NO_LOG, True, ("batch", "early", "the wrapper never started (no job log)", None, ())),
    (Outcome(S.FAILED, reason="r"), NO_LOG, True, ("batch", "early", "r", None, ())),
    (Outcome(S.FAILED), wrapped("0 START 1 h"), True,
     ("worker", "early", "the wrapper started but never ended", None, ())),
    (Outcome(S.FAILED), wrapped("0 START 1 h", "1 SUCCEEDED a", "2 FAILED b", "3 END 0"), True,
     ("application", "early", "more than one terminal keyword (SUCCEEDED, FAILED)", None, ())),
    (Outcome(S.COMPLETED), wrapped("0 START 1 h", "1 SUCCEEDED out.txt", "3 END 0"), True,
     ("user", "success", "SUCCEEDED", S.COMPLETED, ("out.txt",))),
    (Outcome(S.FAILED), wrapped("0 START 1 h", "1 EXIT 0", "3 END 4"), True,
     ("application", "success", "exit code 0", S.COMPLETED, ())),
    (Outcome(S.FAILED), wrapped("0 START 1 h", "1 EXIT 3", "3 END 0"), True,
     ("application", "early", "exit code 3 without a terminal keyword", None, ())),
    (Outcome(S.FAILED), wrapped("0 START 1 h", "3 END 0"), True,
     ("application", "success", "exit code 0", S.COMPLETED, ())),
])
def test_classifications(outcome: Outcome, log: RunLog, wrapper: bool,
                         expected: tuple[object, ...]) -> None:
    assert classify(outcome, log, L, None, wrapper=wrapper) == expected


def test_a_run_without_a_wrapper_is_late_from_the_early_limit_on() -> None:
    assert classify(Outcome(S.FAILED), NO_LOG, L, 60.0, wrapper=False)[1] == "late_unhandled"
    assert classify(Outcome(S.FAILED), NO_LOG, L, 59.9, wrapper=False)[1] == "early"


def test_missing_output_times_the_run_by_the_callers_clock_without_a_log_clock() -> None:
    log = wrapped("0 START 1 h", "1 NOMATCH *.root", "3 END 0")
    assert classify(Outcome(S.COMPLETED), log, L, None)[1] == "early"
    untimed = RunLog(started=None, end_code=0, keywords=[(1.0, "NOMATCH", "*.root")])
    level, verdict, reason, status, _ = classify(Outcome(S.COMPLETED), untimed, L, 120.0, wrapper=False)
    assert (level, verdict, status) == ("application", "late_unhandled", None)
    assert reason == "output file pattern '*.root' matched nothing"
    assert classify(Outcome(S.COMPLETED), untimed, L, 120.0, wrapper=False, missing_output_fails=False)[3] == \
        S.COMPLETED


def test_a_users_hold_is_counted_and_gives_its_data_back() -> None:
    d = decide(Outcome(S.FAILED), wrapped("0 START 1 h", "1 HOLD a b", "2 END 0"), L, {"early": 2}, ["x"])
    assert d == Decision(S.HELD, "user", "early", "HOLD a b", retry_args=("a", "b"), counters={"early": 3})


def test_a_final_decision_keeps_the_previous_args_and_the_outputs_of_a_success() -> None:
    d = decide(Outcome(S.COMPLETED), wrapped("0 START 1 h", "1 SUCCEEDED o.txt", "2 END 0"), L, {"e": 1}, ["p"])
    assert d == Decision(S.COMPLETED, "user", "success", "SUCCEEDED", outputs=("o.txt",), retry_args=("p",),
                         counters={"e": 1})
    d = decide(Outcome(S.KILLED), NO_LOG, L, {}, ["p"])
    assert d == Decision(S.KILLED, "backend", "killed", "killed", outputs=(), retry_args=("p",), counters={})


def test_missing_output_fails_by_default() -> None:
    log = wrapped("0 START 1 h", "1 NOMATCH *.root", "2 END 0")
    assert decide(Outcome(S.COMPLETED), log, L, {}, []).status == S.FAILED
    assert decide(Outcome(S.COMPLETED), log, Limits(0, 0, 0, 60.0), {}, []).status == S.FAILED


def test_retries_and_their_limit() -> None:
    d = decide(Outcome(S.FAILED), NO_LOG, L, {}, ["p"], wrapper=False)
    assert d == Decision(S.FAILED, "application", "early", "failed", retry=True, retry_args=("p",),
                         counters={"early": 1})
    d = decide(Outcome(S.FAILED), NO_LOG, L, {"early": 1}, ["p"], wrapper=False)
    assert d == Decision(S.FAILED, "application", "early", "failed", retry_args=("p",), limit_reached="max_early",
                         limit=1, counters={"early": 2})
    assert d.reason == "failed; retry limit max_early=1 reached"


def test_limits_bound_the_infrastructure_apart() -> None:
    assert L.bound("application", "early", {}) == ("max_early", 1, 0)
    assert L.bound("worker", "early", {"infrastructure:early": 2}) == ("max_early", 1, 2)
    zero = Limits(1, 1, 1, 60.0, 0)
    assert zero.bound("worker", "early", {"infrastructure:early": 1, "early": 5}) == ("max_infrastructure", 0, 1)
    two = Limits(1, 1, 1, 60.0, 2)
    assert two.bound("batch", "late_unhandled", {"infrastructure:early": 1, "infrastructure:late_unhandled": 1}) \
        == ("max_infrastructure", 2, 2)
    assert two.bound("application", "early", {"infrastructure:early": 1}) == ("max_early", 1, 0)
