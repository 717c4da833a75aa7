"""The state machine: the one place where a job's status changes.

Synchronous and free of I/O, in the manner of h11's connection state and
Dask's ``WorkerState``: it is fed requests to move jobs and returns a
:class:`Step` (what changed, what was refused, which masters moved, what
must happen next). The engine persists a step and tells listeners; the
tests drive every rule with no loop, disk or backend.

A master's status is never set by a transition. It is derived from
per-status counters that are updated by each subjob change, O(1) per
change, so a master of 100,000 subjobs is never rescanned.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .ids import FQID, fqid_str
from .status import ALL_STATUSES, FINAL, START_STATUSES, JobStatus, allowed, master_status

S = JobStatus


@dataclass(frozen=True, slots=True)
class Change:
    """A job moved from ``old`` to ``new`` at ``time``."""

    fqid: FQID
    old: JobStatus
    new: JobStatus
    time: float


@dataclass(frozen=True, slots=True)
class Refusal:
    """A requested move that the table forbids: recorded, never applied."""

    fqid: FQID
    old: JobStatus
    new: JobStatus
    reason: str


@dataclass(frozen=True, slots=True)
class MasterChange:
    """A master's derived status changed."""

    master: int
    old: JobStatus
    new: JobStatus
    time: float


@dataclass(slots=True)
class Step:
    """What one request did; the engine carries it out."""

    changes: list[Change] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    masters: list[MasterChange] = field(default_factory=list)
    #: Masters whose every subjob is now final: their merger is due.
    ended: list[int] = field(default_factory=list)

    def extend(self, other: Step) -> None:
        self.changes += other.changes
        self.refused += other.refused
        self.masters += other.masters
        self.ended += other.ended


class MasterState:
    """Counters and timestamps of one master, kept in step with its subjobs."""

    __slots__ = ("statuses", "counts", "pinned", "status", "first", "last", "postprocess_failed")

    def __init__(self, statuses: bytearray) -> None:
        self.statuses = statuses
        self.counts = [0] * len(ALL_STATUSES)
        for code in statuses:
            self.counts[code] += 1
        #: While ``submit()`` runs the master shows this instead of the rules.
        self.pinned: JobStatus | None = None
        self.status = S.NEW
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        #: Set when the merger failed: a master that would be completed is failed.
        self.postprocess_failed = False

    def count_map(self) -> dict[JobStatus, int]:
        return {s: self.counts[s.code] for s in ALL_STATUSES if self.counts[s.code]}

    def all_final(self) -> bool:
        n_final = sum(self.counts[s.code] for s in FINAL)
        return n_final == len(self.statuses) > 0


class StateMachine:
    """Holds the status of every job known to one orchestrator.

    Runnable top-level jobs (no splitter) live in ``_singles``; subjobs live
    in their master's ``bytearray``. ``order`` is DESIGN.md's
    ``master_status_order``.
    """

    def __init__(self, order: str = "submitted-first") -> None:
        master_status({}, order)  # validates the setting once, up front
        self.order = order
        self._singles: dict[int, JobStatus] = {}
        self._masters: dict[int, MasterState] = {}

    # ----------------------------------------------------------- registry
    def add_job(self, job_id: int, status: JobStatus = S.NEW) -> None:
        """Register a top-level job that has no subjobs (yet)."""
        self._singles[job_id] = status

    def add_master(
        self,
        master: int,
        statuses: Sequence[JobStatus] | bytearray,
        *,
        first: dict[str, float] | None = None,
        last: dict[str, float] | None = None,
        postprocess_failed: bool = False,
    ) -> JobStatus:
        """Register a master with existing subjobs (on reopen or after split)."""
        codes = statuses if isinstance(statuses, bytearray) else bytearray(s.code for s in statuses)
        state = MasterState(codes)
        state.first, state.last = dict(first or {}), dict(last or {})
        state.postprocess_failed = postprocess_failed
        self._singles.pop(master, None)
        self._masters[master] = state
        state.status = self._derive(state)
        return state.status

    def forget(self, job_id: int) -> None:
        self._singles.pop(job_id, None)
        self._masters.pop(job_id, None)

    def split(self, master: int, n_subjobs: int) -> None:
        """The master's splitter made ``n_subjobs`` new subjobs; it is ``submitting``."""
        state = MasterState(bytearray([S.NEW.code]) * n_subjobs)
        state.pinned = S.SUBMITTING
        state.status = S.SUBMITTING
        self._singles.pop(master, None)
        self._masters[master] = state

    def unsplit(self, master: int) -> None:
        """Rollback: the master has no subjobs and is ``new`` again."""
        self._masters.pop(master, None)
        self._singles[master] = S.NEW

    # ------------------------------------------------------------ queries
    def is_master(self, job_id: int) -> bool:
        return job_id in self._masters

    def master(self, master: int) -> MasterState:
        return self._masters[master]

    def status(self, fqid: FQID) -> JobStatus:
        if len(fqid) == 1:
            job_id = fqid[0]
            if job_id in self._masters:
                state = self._masters[job_id]
                return state.pinned or state.status
            return self._singles[job_id]
        return JobStatus.from_code(self._masters[fqid[0]].statuses[fqid[1]])

    def subjob_ids(self, master: int, statuses: Iterable[JobStatus]) -> list[int]:
        """Indexes of a master's subjobs in any of ``statuses``, ascending."""
        wanted = {s.code for s in statuses}
        return [i for i, code in enumerate(self._masters[master].statuses) if code in wanted]

    # -------------------------------------------------------- transitions
    def pin(self, master: int, status: JobStatus | None, now: float) -> Step:
        """Show ``status`` on a master while an operation runs; ``None`` derives it again."""
        step = Step()
        if master in self._singles:
            old = self._singles[master]
            if status is not None and old != status:
                self._singles[master] = status
                step.changes.append(Change((master,), old, status, now))
            return step
        state = self._masters[master]
        old = state.pinned or state.status
        state.pinned = status
        if status is None:
            state.status = self._derive(state)  # split() leaves a placeholder; never let it show
        new = status or state.status
        if new != old:
            step.masters.append(MasterChange(master, old, new, now))
            if status is None and state.all_final():
                step.ended.append(master)
        return step

    def set_postprocess_failed(self, master: int, failed: bool, now: float) -> Step:
        state = self._masters[master]
        state.postprocess_failed = failed
        return self._rederive(master, state, now, report_end=False)

    def move(self, fqids: Iterable[FQID], new: JobStatus, now: float) -> Step:
        """Move each job to ``new`` where the table allows it; refuse the rest.

        Masters cannot be moved: their status is derived (a request to move
        one is refused). Each master touched is re-derived once, at the end.
        """
        step = Step()
        touched: set[int] = set()
        for fqid in fqids:
            old = self._current(fqid)
            if old is None:
                step.refused.append(Refusal(fqid, new, new, "unknown job"))
                continue
            if len(fqid) == 1 and fqid[0] in self._masters:
                step.refused.append(Refusal(fqid, old, new, "a master's status is derived"))
                continue
            if not allowed(old, new):
                reason = f"illegal transition {old.value} -> {new.value}"
                step.refused.append(Refusal(fqid, old, new, reason))
                continue
            self._set(fqid, old, new, now)
            step.changes.append(Change(fqid, old, new, now))
            if len(fqid) > 1:
                touched.add(fqid[0])
        for master in sorted(touched):
            step.extend(self._rederive(master, self._masters[master], now))
        return step

    # ----------------------------------------------------------- internal
    def _current(self, fqid: FQID) -> JobStatus | None:
        if not 1 <= len(fqid) <= 2 or any(p < 0 for p in fqid):
            return None  # a negative index or a deeper id would otherwise alias another subjob
        try:
            return self.status(fqid)
        except (KeyError, IndexError):
            return None

    def _set(self, fqid: FQID, old: JobStatus, new: JobStatus, now: float) -> None:
        if len(fqid) == 1:
            self._singles[fqid[0]] = new
            return
        state = self._masters[fqid[0]]
        state.statuses[fqid[1]] = new.code
        if new == S.SUBMITTING:
            state.postprocess_failed = False  # a new run: the merger will run again
        state.counts[old.code] -= 1
        state.counts[new.code] += 1
        key = new.value
        if new in START_STATUSES:
            state.first.setdefault(key, now)
            state.first[key] = min(state.first[key], now)
        else:
            state.last[key] = max(state.last.get(key, now), now)
            if new in FINAL:
                state.last["final"] = max(state.last.get("final", now), now)

    def _derive(self, state: MasterState) -> JobStatus:
        status = master_status(state.count_map(), self.order)
        if status == S.COMPLETED and state.postprocess_failed:
            return S.FAILED
        return status

    def _rederive(
        self, master: int, state: MasterState, now: float, *, report_end: bool = True
    ) -> Step:
        step = Step()
        shown_before = state.pinned or state.status
        new = self._derive(state)
        state.status = new
        shown_after = state.pinned or new
        if shown_after != shown_before:
            step.masters.append(MasterChange(master, shown_before, shown_after, now))
        ended = state.all_final() and shown_after != shown_before
        if report_end and state.pinned is None and ended:
            step.ended.append(master)
        return step


__all__ = ["Change", "MasterChange", "MasterState", "Refusal", "StateMachine", "Step", "fqid_str"]
