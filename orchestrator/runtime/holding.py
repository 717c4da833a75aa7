"""The runs one backend holds: the one owner of what is known of each, from its acceptance until it is let go.

An actor holds the runs its driver accepted (or that were held when the
home was last closed); its monitor asks about them, and hears them. What
either learns goes through :class:`Holding`'s few calls, never its fields:

- :meth:`Holding.hold` a run, and :meth:`Holding.let_go` of it (it ended, was
  killed, or is no longer the backend's); :meth:`Holding.forget` a removed job.
- a run's status is the core's: :meth:`Holding.accepted` takes each change
  the state machine made (the bus's hook), never a report before the core
  judged it. A held run the core moved out of a backend's hands (lost, forced)
  is no longer watched; its handle is kept for the kill that may follow
  (:meth:`Holding.take_lost`).
- silence: :meth:`Holding.silent` notes since when a run has had no
  intelligible answer (the core decides, from the monitor's report, when that
  makes it lost), :meth:`Holding.heard` that it has one again.
- :meth:`Holding.statistics` for metrics and tests, as trio's ``statistics()``.

The runs themselves are kept compactly by :class:`~.held.HeldRuns`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.statuses import MONITORED, STARTED, JobStatus
from ..plugin.contract import RunHandle
from .held import HeldRuns, MakeHandle, RunKey


@dataclass(frozen=True, slots=True)
class HoldingStatistics:
    """What one backend holds: runs ``held`` (``polled`` of them asked about each tick, ``silent`` of them with no
    intelligible answer lately), and runs ``lost`` (no longer watched, kept for their kill)."""

    held: int
    polled: int
    silent: int
    lost: int


@dataclass(frozen=True, slots=True)
class Silence:
    """A held run with no intelligible answer since ``since``, at its attempt ``attempt``."""

    key: RunKey
    since: float
    attempt: int


class Holding:
    """See the module docstring. ``polled(settings)``: whether the driver must be asked about runs of these
    settings (its mode for them is not reporting)."""

    def __init__(self, make_handle: MakeHandle, polled: Callable[[Mapping[str, Any]], bool]) -> None:
        self._runs = HeldRuns(make_handle)
        self._is_polled = polled
        #: Of the runs held, those the driver must be polled about, with their handles (a poll hands them all).
        self._polled: dict[RunKey, RunHandle] = {}
        #: Runs the core moved out of the backend's hands: no longer watched, kept for the kill after them.
        self._lost: dict[RunKey, RunHandle] = {}
        #: Since when each held run has had no intelligible answer.
        self._silent: dict[RunKey, float] = {}

    # ------------------------------------------------------------ hold and let go
    def hold(self, job: int, indexes: Sequence[int] | None, backend_ids: Sequence[str], attempts: Sequence[int],
             settings: Sequence[Mapping[str, Any]], statuses: JobStatus | Sequence[JobStatus]) -> None:
        """Hold runs of ``job`` (``indexes`` ``None``: the job itself): answered for now, or held when the home
        was last closed."""
        if not backend_ids:
            return
        self._runs.add_many(job, indexes, backend_ids, attempts, settings, statuses)
        asked: dict[int, bool] = {}
        forgotten = self._lost or self._silent
        for k, s in enumerate(settings):
            key: RunKey = (job, None if indexes is None else indexes[k])
            if forgotten:  # a new attempt: nothing of the one before stays
                self._lost.pop(key, None)
                self._silent.pop(key, None)
            polled = asked.get(id(s))
            if polled is None:
                polled = asked[id(s)] = self._is_polled(s)
            if polled:
                handle = self._runs.handle(key)
                assert handle is not None
                self._polled[key] = handle

    def let_go(self, job: int, indexes: Sequence[int] | None, *, handles: bool = False) -> list[RunHandle]:
        """Let go of runs of ``job`` (``None``: the job itself), held or lost; with ``handles``, theirs (made now)."""
        gone: list[RunHandle] = []
        keys: Sequence[RunKey] = [(job, None)] if indexes is None else [(job, i) for i in indexes]
        if handles:
            gone = [h for key in keys if (h := self._lost.pop(key, None) or self._runs.handle(key)) is not None]
        elif self._lost:
            for key in keys:
                self._lost.pop(key, None)
        if self._polled or self._silent:
            for key in keys:
                self._polled.pop(key, None)
                self._silent.pop(key, None)
        if indexes is None:
            self._runs.discard((job, None))  # (only a job that runs itself: never a master's subjob 0)
        else:
            self._runs.discard_many(job, indexes)
        return gone

    def forget(self, job: int) -> None:
        """Every run of a job that is removed."""
        for kept in (self._polled, self._lost, self._silent):
            if kept:
                for key in [k for k in kept if k[0] == job]:
                    del kept[key]
        self._runs.discard_job(job)

    def take_lost(self, key: RunKey) -> RunHandle | None:
        """The handle of a run the core took out of the backend's hands, for its kill (it is let go of)."""
        return self._lost.pop(key, None)

    # ------------------------------------------------------------ the core's word
    def accepted(self, job: int, indexes: Sequence[int] | None, status: JobStatus) -> None:
        """The core moved runs of ``job`` to ``status``: a held run on its way takes it (a polled driver answers only
        what differs from it); one moved out of the backend's hands is no longer watched (kept for its kill)."""
        runs = self._runs
        if not runs.has_job(job):
            return
        if status in MONITORED:
            if indexes is not None and not self._polled:
                runs.set_statuses(job, indexes, status)
                return
            for i in indexes if indexes is not None else [None]:
                key = (job, i)
                runs.set_status(key, status)
                handle = self._polled.get(key)
                if handle is not None and handle.status != status:
                    self._polled[key] = _with_status(handle, status)
            return
        if indexes is None:
            handle = runs.handle((job, None))
            if handle is not None:
                self.let_go(job, None)
                self._lost[(job, None)] = handle
            return
        lost: dict[RunKey, RunHandle] = {(job, i): h for i in indexes if (h := runs.handle((job, i))) is not None}
        if lost:  # let go of in one call, their handles kept for the kill that follows
            self.let_go(job, [i for _, i in lost if i is not None])
            self._lost.update(lost)

    # ------------------------------------------------------------ silence
    def silent(self, keys: Sequence[RunKey], now: float) -> list[Silence]:
        """No intelligible answer for these held runs now: each with since when it has had none."""
        out = []
        for key in keys:
            attempt = self._runs.attempt(key)
            if attempt is not None:
                out.append(Silence(key, self._silent.setdefault(key, now), attempt))
        return out

    def heard(self, keys: Sequence[RunKey]) -> None:
        """An intelligible answer for these runs."""
        if self._silent:
            for key in keys:
                self._silent.pop(key, None)

    # ------------------------------------------------------------ reading
    def __contains__(self, key: object) -> bool:
        return key in self._runs

    def polled(self) -> list[tuple[RunKey, RunHandle]]:
        """The runs a poll asks about, with their handles (the statuses the core last recorded)."""
        return list(self._polled.items())

    def started(self, job: int, which: Collection[int | None] | None) -> list[RunKey]:
        """The held runs of ``job`` the core has running or completing (of ``which`` only, unless ``None``)."""
        runs = self._runs
        if which is None:
            return runs.keys_in(job, STARTED)
        return [(job, i) for i in which if runs.status((job, i)) in STARTED]

    def jobs(self) -> list[int]:
        return self._runs.jobs()

    def handle(self, key: RunKey) -> RunHandle | None:
        return self._runs.handle(key)

    def handles(self, job: int, indexes: Sequence[int] | None) -> list[RunHandle]:
        return self._runs.handles(job, indexes)

    def settings(self, key: RunKey) -> Mapping[str, Any] | None:
        return self._runs.settings(key)

    def statistics(self) -> HoldingStatistics:
        return HoldingStatistics(held=len(self._runs), polled=len(self._polled), silent=len(self._silent),
                                 lost=len(self._lost))


def _with_status(handle: RunHandle, status: JobStatus) -> RunHandle:
    return RunHandle(handle.fqid, handle.index, handle.backend_id, handle.settings, handle.outputdir, status,
                     handle.key, handle.attempt, handle.jobdir, handle.owner)
