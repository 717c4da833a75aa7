"""One top-level job as the state machine holds it: its profile, its runs, its derived status.

A job without subjobs has a :class:`RunTable` of one run (index 0: the job
itself). A master has one run per subjob; its own status is never set by a
transition but derived from its subjobs' per-status counters (docs/design.md's
rules, O(1) per change) or, while an operation on it runs or a linked job
stands in for its subjobs, shown as ``pinned``.
"""

from __future__ import annotations

from typing import Any

from .events import Profile
from .statuses import ACTIVE, ALL_STATUSES, FINAL, START_STATUSES, JobStatus, master_status
from .table import RunExtra, RunTable


class JobState:
    """See the module docstring. ``top`` holds the job's own info (a master's reason and timestamps)."""

    __slots__ = ("id", "profile", "runs", "is_master", "pinned", "derived", "top", "partition", "link",
                 "created", "attempt", "post_failed", "postprocessing", "merged_at", "order")

    def __init__(self, job_id: int, profile: Profile, created: float, order: str = "submitted-first") -> None:
        self.id = job_id
        self.profile = profile
        self.runs = RunTable(1)
        self.is_master = False
        self.pinned: JobStatus | None = None
        self.derived = JobStatus.NEW
        self.top = RunExtra()
        #: Pre-job / aggregator bookkeeping: on a master ``prejob``, ``aggregator`` (ids), ``phase``,
        #: ``failed``; on a linked job ``master`` and ``role``.
        self.partition: dict[str, Any] = {}
        self.link: tuple[int, str] | None = None
        self.created = created
        #: A master's own submit counter (each submit and resubmit of it).
        self.attempt = 0
        #: The postprocessors failed the master: a master that would be completed is failed.
        self.post_failed = False
        self.postprocessing = False
        self.merged_at = 0.0
        self.order = order

    # ------------------------------------------------------------ status
    @property
    def status(self) -> JobStatus:
        """What the job shows: a single run's status, or a master's pinned or derived one."""
        if not self.is_master:
            return JobStatus.from_code(self.runs.status[0])
        return self.pinned or self.derived

    def derive(self) -> JobStatus:
        status = master_status(self.counts(), self.order)
        if status == JobStatus.COMPLETED and (self.post_failed or self.partition.get("failed")):
            return JobStatus.FAILED
        return status

    def all_final(self) -> bool:
        return self.is_master and len(self.runs) > 0 and self.runs.count(FINAL) == len(self.runs)

    def active(self, *, postprocess: bool = True) -> bool:
        """Something of the job is submitting, submitted, running or completing (or post-processing)."""
        if postprocess and self.postprocessing:
            return True
        if self.is_master:
            if self.pinned is not None and self.pinned in ACTIVE:
                return True
            return self.runs.count(ACTIVE) > 0
        return self.status in ACTIVE

    def counts(self) -> dict[JobStatus, int]:
        """A master's subjobs per status (``{}`` for a job that runs itself)."""
        if not self.is_master:
            return {}
        # by position in the counters (a status's code is its position): no walk of the enum per call
        return {ALL_STATUSES[code]: n for code, n in enumerate(self.runs.counts) if n}

    # ------------------------------------------------------------ subjobs
    def split(self, n: int) -> None:
        """The job now has ``n`` subjobs, all ``new``."""
        self.runs = RunTable(n)
        self.is_master = True
        self.derived = JobStatus.NEW

    def unsplit(self) -> None:
        """Back to a job without subjobs, ``new`` (a rolled-back submission)."""
        self.runs = RunTable(1)
        self.is_master = False
        self.pinned = None
        self.derived = JobStatus.NEW
        self.top.timestamps = {"new": self.created}

    def note_master_times(self, status: JobStatus, time: float) -> None:
        """A master's start times are its earliest subjob's, its end times its latest. The final ones
        (``final``, ``completed``, ``failed``, ``killed``) only once the master is final: :meth:`note_master_end`."""
        stamps = self.top.timestamps
        key = status.value
        if status in START_STATUSES:
            stamps[key] = min(stamps.get(key, time), time)
        elif status not in FINAL:
            stamps[key] = max(stamps.get(key, time), time)

    def note_master_end(self) -> None:
        """A master's final times once every subjob is final (the latest subjob's ``final``, and per final status
        the latest of the subjobs that ended so); while any subjob is not final, none (a resubmission drops them)."""
        stamps = self.top.timestamps
        for key in ("final", *(s.value for s in FINAL)):
            stamps.pop(key, None)
        if not self.all_final():
            return
        runs = self.runs
        finals = runs.times["final"]
        ended = [s for s in FINAL if runs.counts[s.code]]
        if len(ended) == 1:
            latest = {ended[0]: max(finals, default=0.0)}
        else:
            latest = {s: max((finals[i] for i in runs.indexes_in([s])), default=0.0) for s in ended}
        for s, t in latest.items():
            if t:
                stamps[s.value] = t
        if latest and (last := max(latest.values())):
            stamps["final"] = last


__all__ = ["JobState"]
