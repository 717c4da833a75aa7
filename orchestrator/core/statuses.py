"""Job statuses, the transition table, the classification of statuses and the master-status rules.

Everything here is pure data and pure functions: the state machine, the
runtime and the tests all read the same table and the same sets (active,
final, endings...), so each rule is written down exactly once.
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


ALL_STATUSES: tuple[JobStatus, ...] = tuple(JobStatus)
_CODES = {s: i for i, s in enumerate(ALL_STATUSES)}
_BY_CODE = dict(enumerate(ALL_STATUSES))

#: docs/design.md, "Statuses and transitions": the only moves a running job may make.
TRANSITIONS: Mapping[JobStatus, frozenset[JobStatus]] = {
    JobStatus.NEW: frozenset({JobStatus.SUBMITTING}),
    JobStatus.SUBMITTING: frozenset({JobStatus.SUBMITTED, JobStatus.NEW, JobStatus.FAILED}),
    JobStatus.SUBMITTED: frozenset({JobStatus.RUNNING, JobStatus.COMPLETING, JobStatus.COMPLETED, JobStatus.FAILED,
                                    JobStatus.KILLED, JobStatus.HELD}),
    JobStatus.RUNNING: frozenset({JobStatus.COMPLETING, JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.KILLED,
                                  JobStatus.HELD}),
    JobStatus.COMPLETING: frozenset({JobStatus.COMPLETED, JobStatus.FAILED}),
    JobStatus.COMPLETED: frozenset({JobStatus.SUBMITTING}),
    JobStatus.FAILED: frozenset({JobStatus.SUBMITTING}),
    JobStatus.KILLED: frozenset({JobStatus.SUBMITTING}),
    JobStatus.HELD: frozenset({JobStatus.SUBMITTING, JobStatus.KILLED}),
}

# The classification of statuses: every other module reads these and defines none of its own.
#: A job in one of these is still in the hands of a backend (or about to be).
ACTIVE: frozenset[JobStatus] = frozenset({JobStatus.SUBMITTING, JobStatus.SUBMITTED, JobStatus.RUNNING,
                                          JobStatus.COMPLETING})
#: A backend has the run and it has not ended: what it may report of a run on its way.
ON_THE_WAY: frozenset[JobStatus] = ACTIVE - {JobStatus.SUBMITTING}
#: The run's program has started (its saved states are worth reading).
STARTED: frozenset[JobStatus] = frozenset({JobStatus.RUNNING, JobStatus.COMPLETING})
#: Monitored: the backend is asked about these every tick.
MONITORED: frozenset[JobStatus] = ON_THE_WAY | {JobStatus.HELD}
FINAL: frozenset[JobStatus] = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.KILLED})
#: Reported statuses that end a run, or stop it for a judgement (held): its log is read and the core judges it.
ENDINGS: frozenset[JobStatus] = FINAL | {JobStatus.HELD}
#: Nothing of the job is under way nor will be by itself: never submitted, or ended (it may be removed; a
#: pre-job or aggregator in one of these has done its part).
AT_REST: frozenset[JobStatus] = FINAL | {JobStatus.NEW}
#: Statuses from which ``kill()`` acts.
KILLABLE: frozenset[JobStatus] = frozenset({JobStatus.SUBMITTED, JobStatus.RUNNING, JobStatus.HELD})
#: Statuses a subjob may be resubmitted from: at rest (``new``: left unsubmitted).
RESUBMITTABLE: frozenset[JobStatus] = AT_REST


def resubmitted_from(only_failed: bool) -> tuple[JobStatus, ...]:
    """The subjobs a master's ``resubmit()`` takes again: failed ones and ones left new, and killed ones unless
    ``only_failed`` (one rule for the core, which resubmits them, and the service's quotas, which count them)."""
    return (JobStatus.FAILED, JobStatus.NEW) if only_failed else (JobStatus.FAILED, JobStatus.NEW, JobStatus.KILLED)


#: A master's timestamps for these are its earliest subjob's, for the rest its latest.
START_STATUSES: frozenset[JobStatus] = frozenset({JobStatus.NEW, JobStatus.SUBMITTING, JobStatus.SUBMITTED,
                                                  JobStatus.RUNNING})

MASTER_ORDERS = ("submitted-first", "running-first")


def allowed(old: JobStatus, new: JobStatus) -> bool:
    """True when the table lets a running job move from ``old`` to ``new``."""
    return new in TRANSITIONS[old]


def attempt_change(old: JobStatus, new: JobStatus) -> int:
    """What a move does to a run's attempt counter: +1 for each submission (a move to ``submitting``), -1 for a
    submission taken back (``submitting`` -> ``new``: rolled back or never attempted, so it never took place)."""
    if new == JobStatus.SUBMITTING:
        return 1
    if old == JobStatus.SUBMITTING and new == JobStatus.NEW:
        return -1
    return 0


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

    submitted = any_of(JobStatus.SUBMITTED, JobStatus.SUBMITTING)
    running = any_of(JobStatus.RUNNING, JobStatus.COMPLETING)
    if order == "submitted-first":
        if submitted:
            return JobStatus.SUBMITTED
        if running:
            return JobStatus.RUNNING
    else:
        if running:
            return JobStatus.RUNNING
        if submitted:
            return JobStatus.SUBMITTED
    if any_of(JobStatus.HELD):
        return JobStatus.HELD
    if any_of(JobStatus.FAILED, JobStatus.NEW):
        return JobStatus.FAILED
    if any_of(JobStatus.COMPLETED):
        return JobStatus.COMPLETED
    return JobStatus.KILLED
