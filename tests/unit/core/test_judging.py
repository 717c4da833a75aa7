"""A run's end judged through the state machine: checkpoint restarts and the action table's decisions, their
reasons and history entries in full (core.retry)."""

from __future__ import annotations

from typing import Any

from orchestrator.core.actions import parse_rules
from orchestrator.core.instructions import AdjustRun, SendSubmit
from orchestrator.core.statuses import JobStatus

from .harness import Harness, limits

S = JobStatus
LOST = "the backend could not be reached"


class Run:
    """One single-subjob master whose run ends again and again; each retry is accepted at once."""

    def __init__(self, **kw: Any) -> None:
        self.h = Harness()
        self.m = self.h.add(**kw)
        self.h.submit_all(self.m, 1)

    def end(self, **kw: Any) -> JobStatus:
        step = self.h.report(self.m, [0], **kw)
        sends = step.of(SendSubmit)
        self.adjusted = step.of(AdjustRun)
        if sends:
            self.h.outcomes(sends[0])
            return S.SUBMITTING
        return self.h.status(self.m, 0)

    def lost(self) -> JobStatus:
        return self.end(status=S.FAILED, verdict="lost")

    def save(self, **state: Any) -> None:
        self.h.report(self.m, [0], S.RUNNING, state=state)

    @property
    def reason(self) -> Any:
        return self.h.sm.info((self.m, 0)).get("reason")

    @property
    def last(self) -> dict[str, Any]:
        entry: dict[str, Any] = self.h.sm.info((self.m, 0))["history"][-1]
        return entry

    @property
    def checkpoint(self) -> dict[str, Any]:
        return dict(self.h.sm.info((self.m, 0)).get("checkpoint", {}))


def without_time(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "time"}


# ------------------------------------------------------------------ checkpoint restarts
def test_a_lost_checkpointable_run_resumes_from_a_state_it_never_saved() -> None:
    r = Run(checkpointable=True)
    assert r.lost() == S.SUBMITTING
    assert r.reason == f"{LOST}; resumed from state ?:0"
    assert without_time(r.last) == {"level": "orchestrator", "verdict": "late_unhandled", "reason": LOST,
                                    "exit_code": None, "retry_args": [], "attempt": 1, "action": "retry",
                                    "state": "?:0", "restart": 1}
    assert r.checkpoint == {"restart_seq": 0, "restarts": 1}
    assert r.lost() == S.SUBMITTING
    assert r.last["restart"] == 2 and r.checkpoint == {"restart_seq": 0, "restarts": 2}


def test_restarts_from_one_state_are_bounded_and_a_new_save_counts_again() -> None:
    r = Run(max_restarts=1)
    r.save(seq=4, label="s4")
    assert r.lost() == S.SUBMITTING
    assert r.reason == f"{LOST}; resumed from state s4"
    assert r.checkpoint == {"seq": 4, "label": "s4", "restart_seq": 4, "restarts": 1}
    assert r.lost() == S.FAILED
    why = f"{LOST}; restarted 1 time(s) from state s4 without a new save: max_restarts_per_state=1 reached"
    assert r.reason == why
    assert without_time(r.last) == {"level": "orchestrator", "verdict": "late_unhandled", "reason": why,
                                    "exit_code": None, "retry_args": [], "attempt": 2, "action": "failed",
                                    "limit": "max_restarts_per_state", "state": "s4"}
    assert r.checkpoint["restarts"] == 2


def test_a_state_without_label_is_named_by_its_seq_and_a_new_seq_starts_the_count_again() -> None:
    r = Run(max_restarts=1)
    r.save(seq=2)
    assert r.lost() == S.SUBMITTING
    assert r.reason == f"{LOST}; resumed from state ?:2"
    r.save(seq=3, restart_seq=3, restarts=0)
    assert r.lost() == S.SUBMITTING
    assert r.checkpoint["restarts"] == 1 and r.last["state"] == "?:3"


def test_restarts_counted_from_a_stored_counter_without_restarts() -> None:
    r = Run(max_restarts=2)
    r.save(seq=5, restart_seq=5)
    assert r.lost() == S.SUBMITTING
    assert r.checkpoint["restarts"] == 1
    assert r.lost() == S.SUBMITTING
    assert r.lost() == S.FAILED


def test_the_retry_limit_is_left_out_of_a_resumed_runs_reason() -> None:
    r = Run(checkpointable=True, limits=limits(unhandled=1))
    r.lost()
    assert r.lost() == S.SUBMITTING  # past the limit, but the infrastructure's fault resumes it anyway
    assert r.reason == f"{LOST}; resumed from state ?:0"
    assert r.last["reason"] == LOST and r.last["action"] == "retry" and "limit" not in r.last


def test_an_application_failure_past_the_limits_does_not_resume() -> None:
    r = Run(checkpointable=True)
    assert r.end(status=S.FAILED, exit_code=3) == S.FAILED
    assert r.checkpoint == {} and "restart" not in r.last


# ------------------------------------------------------------------ the action table
def test_a_hold_rule() -> None:
    r = Run(limits=limits(unhandled=1), actions=parse_rules([{"action": "hold", "reason": "limit"}]))
    assert r.lost() == S.SUBMITTING
    assert r.lost() == S.HELD
    assert r.reason == f"{LOST}; held by rule rule-1"
    assert without_time(r.last) == {
        "level": "orchestrator", "verdict": "late_unhandled", "reason": f"{LOST}; retry limit max_late_unhandled=1 "
        "reached", "exit_code": None, "retry_args": [], "attempt": 2, "action": "held", "rule": "rule-1",
        "change": "hold"}
    assert not r.h.sm.active((r.m, 0))


def test_a_fail_rule() -> None:
    r = Run(limits=limits(unhandled=1), actions=parse_rules([{"name": "f", "action": "fail", "reason": "limit"}]))
    r.lost()
    assert r.lost() == S.FAILED
    assert r.reason == f"{LOST}; failed by rule f"
    assert r.last["action"] == "failed" and r.last["rule"] == "f" and r.last["change"] == "fail"
    assert "limit" not in r.last


def test_a_retrying_rule_up_to_its_max() -> None:
    r = Run(checkpointable=True, actions=parse_rules([{"name": "m", "action": "more_memory", "max": 1}]))
    assert r.end(status=S.FAILED, exit_code=2) == S.SUBMITTING
    assert len(r.adjusted) == 1 and r.adjusted[0].rule == "m"
    assert r.reason == "failed; retried by rule m (mem x2)"
    assert r.last["action"] == "retry" and r.last["change"] == "mem x2"
    assert r.checkpoint == {}
    assert r.end(status=S.FAILED, exit_code=2) == S.FAILED
    assert r.reason == "failed; rule m retried it 1 time(s): its max=1 reached"
    assert r.last["action"] == "failed" and r.last["limit"] == "rule:m"


def test_a_retrying_rule_on_a_held_checkpointable_run_is_not_a_restart() -> None:
    r = Run(checkpointable=True, actions=parse_rules([{"action": "retry", "verdict": "hold"}]))
    assert r.end(status=S.HELD, verdict="cancelled") == S.SUBMITTING
    assert r.reason == "cancelled by the system; retried by rule rule-1 (retry)"
    assert r.checkpoint == {} and "restart" not in r.last
    assert r.last["action"] == "retry"
    assert not r.adjusted  # a plain retry changes no setting


def test_a_retrying_rule_on_a_lost_checkpointable_run_resumes_it() -> None:
    r = Run(checkpointable=True, actions=parse_rules([{"action": "elsewhere", "set": {"partition": "b"}}]))
    assert r.lost() == S.SUBMITTING
    assert r.reason == f"{LOST}; resumed from state ?:0"
    assert r.last["action"] == "retry" and r.last["restart"] == 1 and r.last["rule"] == "rule-1"
    assert r.adjusted[0].values == (("partition", "b"),)


def test_rules_decide_the_history_action_even_when_the_limits_would_retry() -> None:
    r = Run(limits=limits(early=5), actions=parse_rules([{"name": "f", "action": "fail", "verdict": "early"}]))
    assert r.end(status=S.FAILED, exit_code=2) == S.FAILED
    assert r.last["action"] == "failed" and r.reason == "failed; failed by rule f"
    r = Run(limits=limits(early=5), actions=parse_rules([{"name": "m", "action": "more_time", "max": 0}]))
    assert r.end(status=S.FAILED, exit_code=2) == S.FAILED
    assert r.last["action"] == "failed" and r.last["limit"] == "rule:m"
    assert r.reason == "failed; rule m retried it 0 time(s): its max=0 reached"


def test_a_retrying_rule_on_a_run_without_states_records_a_retry() -> None:
    r = Run(actions=parse_rules([{"name": "t", "action": "more_time"}]))
    assert r.end(status=S.FAILED, exit_code=2) == S.SUBMITTING
    assert r.last["action"] == "retry" and r.last["change"] == "time x2" and "restart" not in r.last
    assert r.reason == "failed; retried by rule t (time x2)"
