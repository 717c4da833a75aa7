"""Job statuses, the transition table and the master-status rules.

Everything here is pure data and pure functions: the state machine and the
tests both read the same table, so the rules are written down exactly once.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class JobStatus(enum.StrEnum):
    """A job's status; a ``str`` so that ``job.status == "failed"`` holds."""

    NEW = "new"
    SUBMITTING = "submitting"
    SUBMITTED = "submitted"
    RUNNING = "running"
    COMPLETING = "completing"
    COMPLETED = "completed"
    FAILED = "failed"
    KILLED = "killed"
    HELD = "held"

    @property
    def code(self) -> int:
        """A small integer, used to keep 100,000 statuses in a ``bytearray``."""
        return _CODES[self]

    @classmethod
    def from_code(cls, code: int) -> JobStatus:
        return _BY_CODE[code]


S = JobStatus
ALL_STATUSES: tuple[JobStatus, ...] = tuple(JobStatus)
_CODES = {s: i for i, s in enumerate(ALL_STATUSES)}
_BY_CODE = dict(enumerate(ALL_STATUSES))

#: docs/design.md, "Statuses and transitions": the only moves a running job may make.
TRANSITIONS: Mapping[JobStatus, frozenset[JobStatus]] = {
    S.NEW: frozenset({S.SUBMITTING}),
    S.SUBMITTING: frozenset({S.SUBMITTED, S.NEW, S.FAILED}),
    S.SUBMITTED: frozenset({S.RUNNING, S.COMPLETING, S.COMPLETED, S.FAILED, S.KILLED, S.HELD}),
    S.RUNNING: frozenset({S.COMPLETING, S.COMPLETED, S.FAILED, S.KILLED, S.HELD}),
    S.COMPLETING: frozenset({S.COMPLETED, S.FAILED}),
    S.COMPLETED: frozenset({S.SUBMITTING}),
    S.FAILED: frozenset({S.SUBMITTING}),
    S.KILLED: frozenset({S.SUBMITTING}),
    S.HELD: frozenset({S.SUBMITTING, S.KILLED}),
}

#: A job in one of these is still in the hands of a backend (or about to be).
ACTIVE: frozenset[JobStatus] = frozenset({S.SUBMITTING, S.SUBMITTED, S.RUNNING, S.COMPLETING})
#: Monitored: the backend is asked about these every tick.
MONITORED: frozenset[JobStatus] = frozenset({S.SUBMITTED, S.RUNNING, S.COMPLETING, S.HELD})
FINAL: frozenset[JobStatus] = frozenset({S.COMPLETED, S.FAILED, S.KILLED})
#: Statuses from which ``kill()`` acts.
KILLABLE: frozenset[JobStatus] = frozenset({S.SUBMITTED, S.RUNNING, S.HELD})
#: Statuses a subjob may be resubmitted from (``new``: left unsubmitted).
RESUBMITTABLE: frozenset[JobStatus] = frozenset({S.NEW, S.COMPLETED, S.FAILED, S.KILLED})
#: A master's timestamps for these are its earliest subjob's, for the rest its latest.
START_STATUSES: frozenset[JobStatus] = frozenset({S.NEW, S.SUBMITTING, S.SUBMITTED, S.RUNNING})

MASTER_ORDERS = ("submitted-first", "running-first")


def allowed(old: JobStatus, new: JobStatus) -> bool:
    """True when the table lets a running job move from ``old`` to ``new``."""
    return new in TRANSITIONS[old]


def parse_status(value: str | JobStatus) -> JobStatus:
    """A status from its name; ``ValueError`` names the valid ones."""
    try:
        return JobStatus(value)
    except ValueError:
        names = ", ".join(s.value for s in ALL_STATUSES)
        raise ValueError(f"unknown status {value!r} (expected one of: {names})") from None


def master_status(counts: Mapping[JobStatus, int], order: str = "submitted-first") -> JobStatus:
    """Derive a master's status from its subjobs' per-status counts.

    docs/design.md's rules 1-6, first match wins; ``order="running-first"`` swaps
    rules 1 and 2. A subjob left ``new`` by a partial submission counts as a
    failure (rule 4). O(1): it reads counters, never the subjobs.
    """
    if order not in MASTER_ORDERS:
        raise ValueError(f"master_status_order must be one of {MASTER_ORDERS}, not {order!r}")

    def any_of(*statuses: JobStatus) -> bool:
        return any(counts.get(s, 0) > 0 for s in statuses)

    submitted = any_of(S.SUBMITTED, S.SUBMITTING)
    running = any_of(S.RUNNING, S.COMPLETING)
    if order == "submitted-first":
        if submitted:
            return S.SUBMITTED
        if running:
            return S.RUNNING
    else:
        if running:
            return S.RUNNING
        if submitted:
            return S.SUBMITTED
    if any_of(S.HELD):
        return S.HELD
    if any_of(S.FAILED, S.NEW):
        return S.FAILED
    if any_of(S.COMPLETED):
        return S.COMPLETED
    return S.KILLED
