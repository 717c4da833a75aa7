"""What a run's end leaves on record, judged through the state machine (core.retry.judge): the attempts' CPU
records, the wrapper's refusals, the saved state, the outputs, the exit code and stderr in the history and
the reason, and what the action table's rules are matched against."""

from __future__ import annotations

from typing import Any

from orchestrator.core.actions import parse_rules
from orchestrator.core.analyser import Limits
from orchestrator.core.events import RunReport, StatusReport
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import SendSubmit
from orchestrator.core.statuses import JobStatus
from orchestrator.core.table import HISTORY_KEPT, RunTable

from .harness import Harness, log, profile

S = JobStatus
CLEAN = ("100 START 1 host", "103 EXIT 0", "103 END 0")


class Run:
    """One single-subjob master, submitted and accepted; its ends are reported at the harness's clock."""

    def __init__(self, **kw: Any) -> None:
        self.h = Harness()
        self.m = self.h.add(**kw)
        self.h.submit_all(self.m, 1)

    def end(self, status: JobStatus, *lines: str, **kw: Any) -> JobStatus:
        if lines:
            kw["log"] = log(*lines)
        self.h.tick()
        step = self.h.report(self.m, [0], status, **kw)
        self.sends = step.of(SendSubmit)
        if self.sends:
            self.h.outcomes(self.sends[0])
            return S.SUBMITTING
        return self.h.status(self.m, 0)

    @property
    def info(self) -> dict[str, Any]:
        return self.h.sm.info((self.m, 0))


# ------------------------------------------------------------------ records of a clean end
def test_each_attempts_cpu_record_is_kept_with_its_attempt() -> None:
    r = Run(wrapper=True)
    assert r.end(S.COMPLETED, *CLEAN, usage={"cpu": 1.5, "wall": 3.0}) == S.COMPLETED
    assert r.info["usage"] == [{"attempt": 1, "cpu": 1.5, "wall": 3.0}]


def test_the_cpu_records_of_a_retried_run_follow_each_other() -> None:
    r = Run(wrapper=True, limits=Limits(1, 0, 0, 60.0))
    assert r.end(S.FAILED, "100 START 1 h", "101 EXIT 2", "101 END 2", usage={"cpu": 1.0}) == S.SUBMITTING
    assert r.end(S.COMPLETED, *CLEAN, usage={"cpu": 2.0}) == S.COMPLETED
    assert r.info["usage"] == [{"attempt": 1, "cpu": 1.0}, {"attempt": 2, "cpu": 2.0}]


def test_a_refused_return_file_is_on_record_and_the_run_still_completes() -> None:
    r = Run(wrapper=True)
    assert r.end(S.COMPLETED, "100 START 1 h", "101 INFO working", "102 REFUSED ../x.txt",
                 "103 SUCCEEDED a.root b.root", "104 EXIT 0", "104 END 0") == S.COMPLETED
    assert r.info["history"] == [{"time": r.h.clock, "level": "user", "verdict": "refused",
                                  "reason": "RETURN_FILE ../x.txt", "attempt": 1}]
    assert r.info["outputs"] == ["a.root", "b.root"]
    assert "reason" not in r.info


def test_refused_lines_by_the_thousand_keep_the_history_as_long_as_ever() -> None:
    """The log is the run's to write too: each ``REFUSED`` line copied the whole history again (minutes of the
    state machine for half a million lines), and all were kept. They are added at once, the last ones kept."""
    r = Run(wrapper=True)
    refused = [f"102 REFUSED f{n}" for n in range(5000)]
    assert r.end(S.COMPLETED, "100 START 1 h", *refused, "104 EXIT 0", "104 END 0") == S.COMPLETED
    assert len(r.info["history"]) == HISTORY_KEPT
    assert r.info["history"][-1]["reason"] == "RETURN_FILE f4999"


def test_the_state_a_run_ends_with_is_kept() -> None:
    r = Run(wrapper=True)
    assert r.end(S.COMPLETED, *CLEAN, state={"seq": 3, "label": "s3", "final": True}) == S.COMPLETED
    assert r.info["checkpoint"] == {"seq": 3, "label": "s3", "final": True}


def test_a_completed_run_is_not_sent_again() -> None:
    r = Run(wrapper=True)
    assert r.end(S.COMPLETED, *CLEAN) == S.COMPLETED
    assert r.sends == []
    assert r.h.sm.attempt((r.m, 0)) == 1


# ------------------------------------------------------------------ the history's exit code and time
def test_the_history_has_the_backends_exit_code_else_the_logs() -> None:
    r = Run(wrapper=True)
    assert r.end(S.FAILED, "100 START 1 h", "101 EXIT 3", "101 END 3") == S.FAILED
    entry = r.info["history"][-1]
    assert entry["exit_code"] == 3 and entry["time"] == r.h.clock
    r = Run(wrapper=True)
    assert r.end(S.FAILED, "100 START 1 h", "101 EXIT 3", "101 END 3", exit_code=137) == S.FAILED
    assert r.info["history"][-1]["exit_code"] == 137


# ------------------------------------------------------------------ stderr in the reason
def test_stderr_is_quoted_for_a_worker_or_batch_level_failure() -> None:
    r = Run(wrapper=True)
    assert r.end(S.FAILED, "100 START 1 h", stderr_tail="oom-killer") == S.FAILED  # started, never ended
    assert r.info["reason"] == "the wrapper started but never ended; stderr: oom-killer"
    assert r.info["history"][-1]["level"] == "worker"
    r = Run(wrapper=True)
    assert r.end(S.FAILED, stderr_tail="no such file") == S.FAILED  # no log at all
    assert r.info["reason"] == "the wrapper never started (no job log); stderr: no such file"
    assert r.info["history"][-1]["level"] == "batch"


def test_stderr_is_not_quoted_for_the_infrastructures_or_the_users_word() -> None:
    r = Run(wrapper=True)
    assert r.end(S.FAILED, "100 START 1 h", "101 FAILED bad input", "102 EXIT 1", "102 END 1",
                 stderr_tail="trace") == S.FAILED
    assert r.info["reason"] == "FAILED bad input"
    r = Run(wrapper=True)
    assert r.end(S.FAILED, verdict="aborted", stderr_tail="trace") == S.FAILED
    assert r.info["reason"] == "aborted by the backend"


# ------------------------------------------------------------------ what the rules are matched against
def test_a_rule_never_applies_to_a_killed_run() -> None:
    r = Run(actions=parse_rules([{"name": "any", "action": "retry"}]))
    assert r.end(S.KILLED) == S.KILLED
    assert "rule" not in r.info.get("history", [{}])[-1]


def test_a_rule_for_another_backend_does_not_apply() -> None:
    r = Run(actions=parse_rules([{"name": "b", "action": "fail", "backends": ["slurm"]},
                                 {"name": "s", "action": "hold", "backends": ["sim"]}]))
    assert r.end(S.FAILED, exit_code=2) == S.HELD
    assert r.info["history"][-1]["rule"] == "s"


def test_a_rule_by_level() -> None:
    rules = parse_rules([{"name": "w", "action": "hold", "level": "worker"}])
    r = Run(wrapper=True, actions=rules)
    assert r.end(S.FAILED, "100 START 1 h") == S.HELD
    r = Run(wrapper=True, actions=rules)
    assert r.end(S.FAILED, "100 START 1 h", "101 EXIT 2", "101 END 2") == S.FAILED
    assert "rule" not in r.info["history"][-1]


def test_a_rule_by_stderr() -> None:
    r = Run(actions=parse_rules([{"name": "e", "action": "hold", "stderr": "Segmentation"}]))
    assert r.end(S.FAILED, exit_code=139, stderr_tail="Segmentation fault") == S.HELD
    r = Run(actions=parse_rules([{"name": "e", "action": "hold", "stderr": "Segmentation"}]))
    assert r.end(S.FAILED, exit_code=139, stderr_tail="Bus error") == S.FAILED


def test_a_rule_by_reason_reads_the_backends_reason_and_the_analysers() -> None:
    rules = parse_rules([{"name": "oom", "action": "hold", "reason": "OUT_OF_MEMORY"}])
    r = Run(wrapper=True, actions=rules)
    assert r.end(S.FAILED, "100 START 1 h", "101 EXIT 137", "101 END 137", reason="OUT_OF_MEMORY") == S.HELD
    assert r.info["reason"] == "exit code 137 without a terminal keyword; held by rule oom"
    rules = parse_rules([{"name": "x", "action": "hold", "reason": "X"}])
    r = Run(wrapper=True, actions=rules)  # without a backend's reason only the analyser's is read
    assert r.end(S.FAILED, "100 START 1 h", "101 EXIT 137", "101 END 137") == S.FAILED
    rules = parse_rules([{"name": "n", "action": "hold", "reason": "^ exit code 137"}])
    r = Run(wrapper=True, actions=rules)
    assert r.end(S.FAILED, "100 START 1 h", "101 EXIT 137", "101 END 137") == S.HELD


# ------------------------------------------------------------------ a run without any start time
def test_a_run_loaded_without_times_is_judged_early() -> None:
    h = Harness()
    table = RunTable(1, S.SUBMITTED)
    h.sm.load(7, profile(), created=1.0, table=table, master=True)
    h.post(StatusReport(stimulus_id=h.sid("poll"), time=h.clock, backend="sim",
                        reports=(RunReport(Runs(7, [0]), S.FAILED, exit_code=2),)))
    assert h.status(7, 0) == S.FAILED
    assert h.sm.info((7, 0))["history"][-1]["verdict"] == "early"
