"""The analyser: why a run ended, and what to do about it (GBS error recovery).

Pure functions, no I/O: given the backend's verdict, the wrapper's log and
the job's retry counters, classify the run by how far it got (docs/design.md's
table: orchestrator, backend, batch, worker, application, user) and by
verdict (early, late handled, late unhandled), then decide: complete, fail,
hold, or retry with which arguments, within which limit.

One reading of the table is ours to state: an application that exits 0
without any terminal keyword has succeeded (a plain executable knows nothing
of the log protocol); non-zero without a keyword is an application-level
failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .runlog import TERMINAL, RunLog
from .statuses import JobStatus

EARLY, LATE_HANDLED, LATE_UNHANDLED = "early", "late_handled", "late_unhandled"
LIMIT_OF = {EARLY: "max_early", LATE_HANDLED: "max_late_handled", LATE_UNHANDLED: "max_late_unhandled"}
#: Levels at which a run failed for a cause outside itself: the infrastructure's faults, never the user's.
INFRASTRUCTURE = frozenset({"orchestrator", "backend", "batch", "worker"})
#: ``info.counters`` keys of the infrastructure's retries start so (``infrastructure:early``...).
INFRA_PREFIX = "infrastructure:"


@dataclass(frozen=True, slots=True)
class Limits:
    """The retry limits of a job. The three user limits count the user's and the application's own failures;
    the infrastructure's faults (:data:`INFRASTRUCTURE` levels) are counted apart, never against them, and
    bounded by ``max_infrastructure`` (all of them together), or, when it is negative (the default), each
    by the same limit as its verdict (``max_early``, ``max_late_unhandled``), counted apart all the same."""

    max_early: int
    max_late_handled: int
    max_late_unhandled: int
    early_seconds: float
    max_infrastructure: int = -1

    @classmethod
    def resolve(cls, policy: Mapping[str, Any], defaults: Mapping[str, Any]) -> Limits:
        """The job's policy, with ``None`` fields taken from the configuration."""
        def pick(name: str, fallback: Any = None) -> Any:
            value = policy.get(name)
            return defaults.get(name, fallback) if value is None else value

        return cls(int(pick("max_early")), int(pick("max_late_handled")), int(pick("max_late_unhandled")),
                   float(pick("early_seconds")), int(pick("max_infrastructure", -1)))

    def bound(self, level: str, verdict: str, counters: Mapping[str, int]) -> tuple[str, int, int]:
        """``(limit's name, its value, retries it has counted)`` for a retry of this level and verdict."""
        if level in INFRASTRUCTURE and self.max_infrastructure >= 0:
            used = sum(n for key, n in counters.items() if key.startswith(INFRA_PREFIX))
            return "max_infrastructure", self.max_infrastructure, used
        name = LIMIT_OF[verdict]
        return name, getattr(self, name), counters.get(counter_key(level, verdict), 0)


def counter_key(level: str, verdict: str) -> str:
    """The ``info.counters`` key a retry of this level and verdict counts under."""
    return INFRA_PREFIX + verdict if level in INFRASTRUCTURE else verdict


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the backend said about a finished run."""

    status: JobStatus
    exit_code: int | None = None
    reason: str | None = None
    #: ``"aborted"`` (the backend gave up on it), ``"cancelled"`` (by the system),
    #: ``"lost"`` (the orchestrator could not learn its fate), or ``None``.
    backend_verdict: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with a finished run."""

    status: JobStatus  # completed, failed, held or killed: the move to make now
    level: str
    verdict: str  # "success", "failed" (by the user), "hold", or one of EARLY / LATE_*
    #: Why the run ended as it did, without the limit (what a rule or a restart adds its own words to).
    cause: str
    retry: bool = False
    retry_args: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    #: The retry limit that failed the run (its name and value), if one did.
    limit_reached: str | None = None
    limit: int = 0
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def reason(self) -> str:
        """The cause, and the limit reached if one is set (a limit of 0 is no retry at all: not named)."""
        if self.limit_reached and self.limit:
            return f"{self.cause}; retry limit {self.limit_reached}={self.limit} reached"
        return self.cause

    def history_entry(self, time: float, exit_code: int | None, attempt: int) -> dict[str, Any]:
        entry = {"time": time, "level": self.level, "verdict": self.verdict, "reason": self.reason,
                 "exit_code": exit_code, "retry_args": list(self.retry_args), "attempt": attempt,
                 "action": "retry" if self.retry else self.status.value}
        if self.limit_reached:
            entry["limit"] = self.limit_reached
        return entry


def _timing(log: RunLog, seconds: float | None, limits: Limits) -> str:
    """Early or late, by how long the run ran (the log's clock, else the caller's)."""
    if log.started is not None and (log.ended is not None or log.keywords):
        end = log.ended if log.ended is not None else max(t for t, _, _ in log.keywords)
        seconds = end - log.started
    if seconds is None:
        return EARLY
    return EARLY if seconds < limits.early_seconds else "late"


def classify(outcome: Outcome, log: RunLog, limits: Limits, seconds: float | None = None, *, wrapper: bool = True,
             missing_output_fails: bool = True) -> tuple[str, str, str, JobStatus | None, tuple[str, ...]]:
    """``(level, verdict, reason, final status or None for retry, data)`` of one run.

    ``wrapper=False``: the backend runs no job wrapper (``sim``, some third-party
    drivers), so there is no log to read and its word is taken as the application's.
    ``missing_output_fails``: a run that would succeed but whose log has ``NOMATCH`` lines (a declared
    ``outputfiles`` pattern matched no file) fails at application level instead (Ganga's
    ``FailJobIfNoOutputMatched``), early or late unhandled by its run time, the patterns named.
    """
    level, verdict, reason, status, data = _classify(outcome, log, limits, seconds, wrapper=wrapper)
    if status == JobStatus.COMPLETED and missing_output_fails:
        missing = [pattern for _, word, pattern in log.keywords if word == "NOMATCH"]
        if missing:
            unhandled = EARLY if _timing(log, seconds, limits) == EARLY else LATE_UNHANDLED
            names = ", ".join(repr(p) for p in missing)
            what = "output file pattern" if len(missing) == 1 else "output file patterns"
            return "application", unhandled, f"{what} {names} matched nothing", None, ()
    return level, verdict, reason, status, data


def _classify(outcome: Outcome, log: RunLog, limits: Limits, seconds: float | None, *, wrapper: bool,
              ) -> tuple[str, str, str, JobStatus | None, tuple[str, ...]]:
    if outcome.status == JobStatus.KILLED:
        return "backend", "killed", outcome.reason or "killed", JobStatus.KILLED, ()
    if outcome.backend_verdict == "lost":
        return "orchestrator", LATE_UNHANDLED, outcome.reason or "the backend could not be reached", None, ()
    if outcome.backend_verdict == "cancelled" or outcome.status == JobStatus.HELD:
        return "backend", "hold", outcome.reason or "cancelled by the system", JobStatus.HELD, ()
    if outcome.backend_verdict == "aborted":
        return "backend", LATE_UNHANDLED, outcome.reason or "aborted by the backend", None, ()
    if not wrapper:
        if outcome.status == JobStatus.COMPLETED:
            return "application", "success", outcome.reason or "completed", JobStatus.COMPLETED, ()
        verdict = EARLY if seconds is None or seconds < limits.early_seconds else LATE_UNHANDLED
        return "application", verdict, outcome.reason or "failed", None, ()
    if log.started is None:
        return "batch", EARLY, outcome.reason or "the wrapper never started (no job log)", None, ()
    timing = _timing(log, seconds, limits)
    unhandled = EARLY if timing == EARLY else LATE_UNHANDLED
    if not log.finished:
        return "worker", unhandled, outcome.reason or "the wrapper started but never ended", None, ()
    terminal = [(word, data) for _, word, data in log.keywords if word in TERMINAL]
    if len(terminal) > 1:
        words = ", ".join(w for w, _ in terminal)
        return "application", unhandled, f"more than one terminal keyword ({words})", None, ()
    if terminal:
        word, data = terminal[0]
        if not data.strip():
            return "application", unhandled, f"{word} without data", None, ()
        args = tuple(data.split())
        handled = EARLY if timing == EARLY else LATE_HANDLED
        if word == "SUCCEEDED":
            return "user", "success", "SUCCEEDED", JobStatus.COMPLETED, args
        if word == "FAILED":
            return "user", "failed", f"FAILED {data.strip()}", JobStatus.FAILED, args
        if word == "HOLD":  # counted as handled, like RETRY; the user decides when it runs again
            return "user", handled, f"HOLD {data.strip()}", JobStatus.HELD, args
        return "user", handled, f"RETRY {data.strip()}", None, args
    code = log.exit_code if log.exit_code is not None else log.end_code
    if code == 0:
        return "application", "success", "exit code 0", JobStatus.COMPLETED, ()
    return "application", unhandled, f"exit code {code} without a terminal keyword", None, ()


def decide(outcome: Outcome, log: RunLog, limits: Limits, counters: Mapping[str, int],
           previous_args: Sequence[str], seconds: float | None = None, *, wrapper: bool = True,
           missing_output_fails: bool = True) -> Decision:
    """Classify the run and apply the retry limits to it."""
    level, verdict, reason, status, data = classify(outcome, log, limits, seconds, wrapper=wrapper,
                                                    missing_output_fails=missing_output_fails)
    new_counters = dict(counters)
    if status == JobStatus.HELD and level == "user":
        # GBS: the hold's data comes back as the retry arguments when it is released without new ones.
        new_counters[verdict] = new_counters.get(verdict, 0) + 1
        return Decision(status, level, verdict, reason, retry_args=data, counters=new_counters)
    if status is not None:
        outputs = data if status == JobStatus.COMPLETED else ()
        return Decision(status, level, verdict, reason, outputs=outputs, retry_args=tuple(previous_args),
                        counters=new_counters)
    # A retry: the application's own args when it said RETRY, else the previous ones. The infrastructure's
    # faults count under keys of their own: they never use up the user's limits.
    args = data if level == "user" else tuple(previous_args)
    key = counter_key(level, verdict)
    new_counters[key] = new_counters.get(key, 0) + 1
    limit_name, limit, used = limits.bound(level, verdict, new_counters)
    if used > limit:
        return Decision(JobStatus.FAILED, level, verdict, reason, retry_args=args, limit_reached=limit_name,
                        limit=limit, counters=new_counters)
    return Decision(JobStatus.FAILED, level, verdict, reason, retry=True, retry_args=args, counters=new_counters)
