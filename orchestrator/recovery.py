"""Fault tolerance glue: judge finished runs, keep track of backends that do not answer.

:func:`judge` turns a driver's report on a finished run into a
:class:`~orchestrator.analyser.Decision` (reading the wrapper's log when the
backend runs the wrapper) and records it in the job's history.
:class:`BackendHealth` remembers, per backend and per run, since when no
intelligible answer came: a fault is the backend's problem, never the job's,
until ``lost_after_seconds`` have passed; then the run is lost (orchestrator
level, late unhandled) and the retry policy decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .analyser import Decision, Limits, Outcome, decide
from .drivers import StatusUpdate
from .ids import FQID
from .job import Job
from .status import JobStatus
from .wrapper import RunLog, read_log

S = JobStatus
#: Reports that end a run (or ask the analyser to look at it).
ENDINGS = frozenset({S.COMPLETED, S.FAILED, S.HELD})
_HISTORY_KEPT = 100


def judge(job: Job, update: StatusUpdate, defaults: dict[str, Any], *, wrapper: bool, now: float) -> Decision:
    """Classify a finished run of ``job`` and decide what happens next."""
    limits = Limits.resolve(job.retry.to_dict(), defaults)
    started = job.info.timestamps.get("running") or job.info.timestamps.get("submitted")
    seconds = now - started if started else None
    log = read_log(job.outputdir) if wrapper and update.backend_verdict is None else RunLog()
    outcome = Outcome(update.status, update.exit_code, update.reason, update.backend_verdict)
    decision = decide(outcome, log, limits, job.info.counters, job.info.retry_args, seconds, wrapper=wrapper)
    info = job.info
    info.counters = dict(decision.counters)
    for _, word, data in log.keywords:
        if word == "REFUSED":  # the wrapper refused a RETURN_FILE: kept on record
            info.history = [*info.history, {"time": now, "level": "user", "verdict": "refused",
                                            "reason": f"RETURN_FILE {data}", "attempt": info.submit_counter}]
    if decision.status == S.COMPLETED:
        info.outputs = list(decision.outputs)
        info.reason = None
    else:
        info.reason = decision.reason
        if decision.retry:
            info.retry_args = list(decision.retry_args)
        entry = decision.history_entry(now, update.exit_code if update.exit_code is not None else log.exit_code,
                                       info.submit_counter)
        info.history = [*info.history, entry][-_HISTORY_KEPT:]
    return decision


@dataclass
class BackendHealth:
    """Since when each run (and each backend) has had no intelligible answer."""

    lost_after: float
    poll_interval: float
    runs: dict[FQID, float] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    resume_at: dict[str, float] = field(default_factory=dict)

    def may_poll(self, backend: str, now: float) -> bool:
        return now >= self.resume_at.get(backend, 0.0)

    def answered(self, backend: str, fqids: list[FQID]) -> None:
        self.failures.pop(backend, None)
        self.resume_at.pop(backend, None)
        for fq in fqids:
            self.runs.pop(fq, None)

    def silent(self, backend: str, fqids: list[FQID], now: float, *, whole_backend: bool) -> list[FQID]:
        """Record no answer for ``fqids``; return those silent for longer than ``lost_after``."""
        if whole_backend:
            n = self.failures[backend] = self.failures.get(backend, 0) + 1
            self.resume_at[backend] = now + min(self.poll_interval * 2 ** min(n, 10), 30.0)  # backoff
        lost = []
        for fq in fqids:
            since = self.runs.setdefault(fq, now)
            if now - since >= self.lost_after:
                lost.append(fq)
                del self.runs[fq]
        return lost
