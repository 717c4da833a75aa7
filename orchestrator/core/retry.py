"""Judging a run's end (GBS): the analyser's verdict, the retry limits, checkpoint restarts, the history.

``judge`` turns a backend's report on one finished run into the run's next
status and whether it is retried, and writes the run's reason, counters,
retry arguments and failure history. Pure: the log, the stderr tail and the
newest saved state came with the report.

A checkpointable run (one with steps, or that saved a state) that failed for
a cause outside itself (orchestrator, backend, batch or worker level) is
resumed from its newest state whatever the limits say, and so is one the
limits retry; either way the restarts from one same state are counted, and
past ``max_restarts_per_state`` the run is failed, so a job that crashes
right after each load stops.
"""

from __future__ import annotations

from dataclasses import dataclass

from .actions import RETRYING, Rule, choose
from .analyser import INFRASTRUCTURE, Decision, Outcome, decide
from .events import RunReport
from .jobs import JobState
from .runlog import RunLog
from .statuses import JobStatus
from .table import HISTORY_KEPT

#: A run's REFUSED line (a file the wrapper would not return) goes into its history to a path's length at most:
#: a run that wrote a hundred of 16 KiB made its record 1.6 MB, and a user's thousand such runs took the
#: service's memory and the repository's disk.
PATH_KEPT = 4096


@dataclass(frozen=True, slots=True)
class Verdict:
    status: JobStatus
    retry: bool
    #: The action-table rule whose retry changes the run's settings first (more memory, more time, elsewhere).
    adjust: Rule | None = None


def judge(js: JobState, i: int, report: RunReport, now: float) -> Verdict:
    """Classify run ``i`` of ``js`` from ``report``; record why; say what becomes of it."""
    runs = js.runs
    started = report.started or runs.time_of(i, "running") or runs.time_of(i, "submitted")
    seconds = (report.ended or now) - started if started else None
    wrapper = js.profile.wrapper
    log = report.log if (wrapper and report.verdict is None and report.log is not None) else RunLog()
    outcome = Outcome(report.status, report.exit_code, report.reason, report.verdict)
    # read without making them: a run that ends cleanly is given no extras (nor empty containers in them)
    counters, retry_args = runs.peek(i, "counters") or {}, runs.peek(i, "retry_args") or []
    decision = decide(outcome, log, js.profile.limits, counters, retry_args, seconds, wrapper=wrapper,
                      missing_output_fails=js.profile.fail_on_missing_output)
    attempt = runs.attempt[i]
    before = dict(counters)
    if decision.counters or counters:
        runs.extra(i).counters = dict(decision.counters)
    if report.state:
        runs.save_state(i, report.state)
    if report.usage:
        extra = runs.extra(i)
        extra.usage = [*(extra.peek("usage") or ()), {"attempt": attempt, **report.usage}][-HISTORY_KEPT:]
    refused = [{"time": now, "level": "user", "verdict": "refused", "reason": f"RETURN_FILE {data[:PATH_KEPT]}",
                "attempt": attempt} for _, word, data in log.keywords if word == "REFUSED"]
    if refused:  # the wrapper refused a RETURN_FILE or an output file: kept on record (the log is the run's to
        extra = runs.extra(i)  # write too: its lines are added once, and the history kept as long as ever)
        extra.history = [*extra.history, *refused[-HISTORY_KEPT:]][-HISTORY_KEPT:]
    if decision.status == JobStatus.COMPLETED:
        if decision.outputs or runs.peek(i, "outputs"):
            runs.extra(i).outputs = list(decision.outputs)
        if runs.peek(i, "reason") is not None:
            runs.extra(i).reason = None
        return Verdict(JobStatus.COMPLETED, False)
    extra = runs.extra(i)
    reason = decision.reason
    if report.stderr_tail and decision.level in ("application", "worker", "batch") and decision.verdict != "failed":
        reason = f"{reason}; stderr: {report.stderr_tail}"
    extra.reason = reason
    if decision.retry or decision.status == JobStatus.HELD:
        extra.retry_args = list(decision.retry_args)
    exit_code = report.exit_code if report.exit_code is not None else log.exit_code
    entry = decision.history_entry(now, exit_code, attempt)
    entry["reason"] = reason
    extra.history = [*extra.history, entry][-HISTORY_KEPT:]
    rule = None
    if js.profile.actions and decision.verdict not in ("success", "killed"):
        rule = choose(js.profile.actions, js.profile.backend, decision.level, decision.verdict,
                      f"{report.reason or ''} {decision.reason}", exit_code, report.stderr_tail)
    if rule is not None:
        return _act(js, i, rule, decision, entry, before)
    retry = decision.retry
    if decision.status == JobStatus.FAILED and (js.profile.checkpointable or "seq" in extra.checkpoint):
        retry = _resume(js, i, decision, entry)
    return Verdict(JobStatus.FAILED if retry else decision.status, retry)


def _resume(js: JobState, i: int, decision: Decision, entry: dict[str, object]) -> bool:
    """Whether a failed checkpointable run starts again from its newest state; updates the restart counter."""
    external = decision.level in INFRASTRUCTURE and decision.verdict not in ("killed", "hold")
    if not (external or decision.retry):
        return False
    extra = js.runs.extra(i)
    cp = extra.checkpoint
    seq = int(cp.get("seq", 0))
    label = str(cp.get("label", f"?:{seq}"))
    if cp.get("restart_seq") == seq:
        cp["restarts"] = int(cp.get("restarts", 0)) + 1
    else:
        cp["restart_seq"], cp["restarts"] = seq, 1
    base = decision.cause
    limit = js.profile.max_restarts
    if cp["restarts"] > limit:
        why = (f"{base}; restarted {limit} time(s) from state {label} without a new save: "
               f"max_restarts_per_state={limit} reached")
        extra.reason = why
        entry.update(action="failed", reason=why, limit="max_restarts_per_state", state=label)
        return False
    entry.pop("limit", None)
    entry.update(action="retry", reason=base, state=label, restart=cp["restarts"])
    extra.reason = f"{base}; resumed from state {label}"
    return True


def _act(js: JobState, i: int, rule: Rule, decision: Decision, entry: dict[str, object],
         counters: dict[str, int]) -> Verdict:
    """The action-table rule decides; its retries are counted against its own ``max``, never the user's limits."""
    extra = js.runs.extra(i)
    extra.counters = counters  # the user's counters stay as they were before this run
    entry.pop("limit", None)
    entry.update(rule=rule.name, change=rule.describe())
    base = decision.cause
    if rule.action == "hold":
        entry["action"] = "held"
        extra.reason = f"{base}; held by rule {rule.name}"
        return Verdict(JobStatus.HELD, False)
    if rule.action == "fail":
        entry["action"] = "failed"
        extra.reason = f"{base}; failed by rule {rule.name}"
        return Verdict(JobStatus.FAILED, False)
    assert rule.action in RETRYING
    used = counters.get(rule.counter, 0)
    if used >= rule.max:
        entry.update(action="failed", limit=rule.counter)
        extra.reason = f"{base}; rule {rule.name} retried it {used} time(s): its max={rule.max} reached"
        return Verdict(JobStatus.FAILED, False)
    extra.counters = {**counters, rule.counter: used + 1}
    entry["action"] = "retry"
    extra.reason = f"{base}; retried by rule {rule.name} ({rule.describe()})"
    if js.profile.checkpointable or "seq" in extra.checkpoint:
        _resume(js, i, decision, entry)  # from the newest state, its restarts counted (the rule retries anyway)
        entry["action"] = "retry"
    return Verdict(JobStatus.FAILED, True, rule if rule.action != "retry" else None)
