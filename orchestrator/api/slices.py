"""Slices: jobs picked out together, with collective operations.

A slice has ``len()``, iteration and indexing, and ``submit``, ``kill``,
``resubmit``, ``copy``, ``remove``, ``wait`` and ``force_status`` for all its
jobs at once, each one request following keep_going: with
``keep_going=False`` it stops at the first failure (what was done before it
stays done) and raises; with ``True`` it does what it can.

``select()`` filters by ``ids``, ``status``, ``name`` (a glob), ``backend``,
``application`` (its type's name), ``since``/``until`` (when the job was
added; a naive datetime is local time) and ``owner`` (a user's name), all
combined with *and*. A
selection of a master's subjobs by status counts from the state machine's
counters and builds subjob objects only when iterated.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..core.errors import JobError
from ..core.ids import FQID
from ..core.model import Backend
from ..core.statuses import JobStatus, parse_status
from . import wire
from .transport import Done, Transport, done, waited


def select_statuses(status: str | JobStatus | Iterable[str | JobStatus] | None) -> list[JobStatus] | None:
    if status is None:
        return None
    if isinstance(status, str):
        return [parse_status(status)]
    return [parse_status(s) for s in status]


def timestamp(value: Any, field: str) -> float | None:
    """A datetime (naive: local time), a date, or epoch seconds, as epoch seconds."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.timestamp()
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day).timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise JobError(f"{field} must be a datetime, not {value!r}", field=field)


class IdRange:
    """Ganga's ``select(minid, maxid)``: ids from ``minid`` to ``maxid`` inclusive (either may be open), and
    among ``ids`` when those are given too."""

    def __init__(self, minid: int | None, maxid: int | None, ids: Any = None) -> None:
        self.lo = minid if minid is not None else 0
        self.hi = maxid
        self.ids = None if ids is None else set(ids)

    def __contains__(self, i: object) -> bool:
        if not isinstance(i, int) or i < self.lo or (self.hi is not None and i > self.hi):
            return False
        return self.ids is None or i in self.ids

    def within(self, n: int) -> Sequence[int]:
        """The indexes of ``range(n)`` it holds."""
        span = range(max(self.lo, 0), n if self.hi is None else max(min(self.hi + 1, n), 0))
        return span if self.ids is None else [i for i in span if i in self.ids]


def id_filter(minid: Any, maxid: Any, ids: Any) -> Any:
    """The ``ids`` filter of ``select(minid, maxid, ids=...)``: an :class:`IdRange` when a bound is given.
    A first positional argument that is not an int is ``ids``, as before ``minid`` existed."""
    if minid is not None and maxid is None and ids is None and not isinstance(minid, int):
        return minid
    for field, value in (("minid", minid), ("maxid", maxid)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise JobError(f"select: {field} must be an integer id, not {value!r}", field=field)
    if minid is None and maxid is None:
        return ids
    return IdRange(minid, maxid, ids)


def matches(job: Any, *, ids: Any, status: list[JobStatus] | None, name: str | None, backend: str | None,
            application: str | None, since: float | None, until: float | None, added: float | None,
            owner: str | None = None) -> bool:
    if ids is not None and job.id not in ids:
        return False
    if owner is not None and job.owner != owner:
        return False
    if status is not None and job.status not in status:
        return False
    if name is not None and not fnmatch.fnmatchcase(job.name, name):
        return False
    if backend is not None and job.backend.name != backend:
        return False
    if application is not None and type(job.application).__name__ != application:
        return False
    if since is not None and (added is None or added < since):
        return False
    return until is None or (added is not None and added <= until)


class JobCollection(ABC):
    """What a slice and a master's subjobs share: ``==`` is the same job objects in the same order, with either
    kind or with a list or a tuple (the lengths first: a master's subjobs are built only if those match)."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __iter__(self) -> Iterator[Any]: ...

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (JobCollection, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(a is b for a, b in zip(self, other, strict=True))


class JobSlice(JobCollection):
    """A list of jobs with collective operations; see the module docstring."""

    def __init__(self, jobs: Iterable[Any]) -> None:
        self._jobs = list(jobs)

    # ------------------------------------------------------------ a sequence
    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._jobs)

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return JobSlice(self._jobs[i])
        return self._jobs[i]

    def __repr__(self) -> str:
        return f"JobSlice({self._jobs!r})"

    def select(self, minid: Any = None, maxid: int | None = None, *, ids: Any = None, status: Any = None,
               name: str | None = None, backend: str | None = None, application: str | None = None,
               since: Any = None, until: Any = None, owner: str | None = None) -> JobSlice:
        """The jobs that pass every filter given; ``select(minid, maxid)`` (Ganga's form) keeps the ids from
        ``minid`` to ``maxid``, both included."""
        ids = id_filter(minid, maxid, ids)
        wanted = select_statuses(status)
        lo, hi = timestamp(since, "since"), timestamp(until, "until")
        return JobSlice([j for j in self._jobs if matches(j, ids=ids, status=wanted, name=name, backend=backend,
                                                          application=application, since=lo, until=hi,
                                                          added=_added(j), owner=owner)])

    # ------------------------------------------------------------ collective operations
    def _transport(self) -> Transport:
        transport: Transport = self._jobs[0].registry.transport
        return transport

    def _built_only(self) -> list[Any]:
        """The job objects of the slice that exist (a lazy selection makes none to act)."""
        return list(self._jobs)

    def _targets(self) -> list[FQID]:
        return [j.fqid_tuple for j in self._jobs]

    async def _act(self, request: wire.Request) -> Done:
        return done(await self._transport().handle(request))

    async def submit(self, keep_going: bool = False) -> Done:
        if not len(self):
            return Done()
        statuses = self._transport().statuses()
        definitions = {}
        for job in self._jobs:  # a new job is submitted as it is defined now
            if job.parent is None and job.id is not None and statuses.exists(job.fqid_tuple) \
                    and job.status == JobStatus.NEW:
                from .validate import validate

                validate(job, job.fqid)
                definitions[str(job.id)] = wire.JobDefinition(name=job.name, spec=wire.job_spec(job.spec(), job.fqid))
        return await self._act(wire.SubmitRequest(targets=wire.Fqids(self._targets()), keep_going=keep_going,
                                                  definitions=definitions or None))

    async def kill(self, keep_going: bool = False) -> Done:
        """Kill every active run of the slice; the answer says how many runs it acted on (0: nothing to do)."""
        if not len(self):
            return Done()
        return await self._act(wire.KillRequest(targets=wire.Fqids(self._targets()), keep_going=keep_going))

    async def resubmit(self, keep_going: bool = False, backend: str | Backend | None = None,
                       only_failed: bool = True, from_state: str | None = None) -> Done:
        if not len(self):
            return Done()
        chosen = None
        if backend is not None:
            from .validate import checked_backend

            chosen = checked_backend(backend, ".".join(map(str, self._targets()[0])))
        spec = wire.BackendSpec(name=chosen.name, settings=chosen.to_dict()["settings"]) if chosen else None
        answer = await self._act(wire.ResubmitRequest(targets=wire.Fqids(self._targets()), only_failed=only_failed,
                                                      keep_going=keep_going, backend=spec, from_state=from_state))
        if chosen is not None:  # the objects show the settings the runs now have (those that are built)
            for job in self._jobs or self._built_only():
                top = job if job.parent is None else job.parent
                top.backend = chosen.copy()
                if job is not top:
                    job.backend = chosen.copy()
        return answer

    async def release(self, retry_args: Sequence[str] | None = None) -> Done:
        """Resume the held runs of the slice; ``retry_args`` reach them as ``ORCH_RETRY_ARG_1..n``."""
        if not len(self):
            return Done()
        args = [str(a) for a in retry_args] if retry_args is not None else None
        return await self._act(wire.ReleaseRequest(targets=wire.Fqids(self._targets()), retry_args=args))

    async def force_status(self, status: str | JobStatus, force: bool = False, keep_going: bool = False) -> Done:
        if not len(self):
            return Done()
        return await self._act(wire.ForceStatusRequest(targets=wire.Fqids(self._targets()),
                                                       status=parse_status(status).value, force=force,
                                                       keep_going=keep_going))

    async def remove(self, keep_going: bool = False) -> Done:
        if not len(self):
            return Done()
        try:
            return await self._act(wire.RemoveRequest(targets=wire.Fqids(self._targets()), keep_going=keep_going))
        finally:
            for job in self._jobs:
                registry = job._registry
                if registry is not None and job.parent is None \
                        and not registry.transport.statuses().exists(job.fqid_tuple):
                    registry.forget(job)

    async def wait(self, timeout: float | None = None) -> None:
        if len(self):
            targets = self._targets()
            waited(await self._transport().handle(wire.WaitRequest(targets=wire.Fqids(targets), timeout=timeout)),
                   targets, timeout)

    async def copy(self) -> JobSlice:
        """A new top-level ``new`` job for each, with the same definition (sharing no object)."""
        out = []
        for job in self._jobs:
            out.append(await job.registry.add(job.template()))
        return JobSlice(out)


class SubjobSelection(JobSlice):
    """A master's subjobs picked out by index and status: counted from the counters, built when iterated."""

    def __init__(self, subjobs: Any, *, ids: Any, status: list[JobStatus] | None, name: str | None,
                 backend: str | None, application: str | None, since: Any, until: Any) -> None:
        self._subjobs = subjobs
        master = subjobs._master
        transport = master.registry.transport
        n = len(subjobs)
        indexes: Sequence[int] = range(n) if status is None else transport.statuses().indexes(master.id, status)
        if isinstance(ids, IdRange):
            indexes = ids.within(n) if status is None else [i for i in indexes if i in ids]
        elif ids is not None:
            wanted = set(ids)
            indexes = [i for i in indexes if i in wanted]
        self._indexes = indexes
        lo, hi = timestamp(since, "since"), timestamp(until, "until")
        self._lazy = name is None and backend is None and application is None and lo is None and hi is None
        super().__init__([])
        if not self._lazy:
            added = _added(master)
            self._jobs = [j for j in self._build(indexes) if matches(j, ids=None, status=None, name=name,
                                                                     backend=backend, application=application,
                                                                     since=lo, until=hi, added=added)]

    def _build(self, indexes: Sequence[int]) -> Iterator[Any]:
        for start in range(0, len(indexes), 1000):
            yield from self._subjobs.build(list(indexes[start:start + 1000]))

    def __len__(self) -> int:
        return len(self._indexes) if self._lazy else len(self._jobs)

    def __iter__(self) -> Iterator[Any]:
        return self._build(self._indexes) if self._lazy else iter(self._jobs)

    def __getitem__(self, i: int | slice) -> Any:
        if not self._lazy:
            return super().__getitem__(i)
        if isinstance(i, slice):
            return JobSlice(self._subjobs.build(list(self._indexes[i])))
        return self._subjobs.build([self._indexes[i]])[0]

    def _targets(self) -> list[FQID]:
        if not self._lazy:
            return super()._targets()
        master = self._subjobs._master.id
        return [(master, i) for i in self._indexes]

    def _transport(self) -> Transport:
        transport: Transport = self._subjobs._master.registry.transport
        return transport

    def _built_only(self) -> list[Any]:
        built = self._subjobs._built
        return [j for i in self._indexes if (j := built.get(i)) is not None] + [self._subjobs._master]

    async def copy(self) -> JobSlice:
        return await JobSlice(list(self)).copy()

    def __repr__(self) -> str:
        return f"<{len(self)} subjobs of job {self._subjobs._master.fqid_or_new}>"


def _added(job: Any) -> float | None:
    top = job
    while top.parent is not None:
        top = top.parent
    registry = top._registry
    if registry is None or top.id is None:
        return None
    return float(registry.transport.statuses().record(top.id).added)
