"""``Job``: a definition until ``orch.jobs.add()`` binds it, then a handle on a job of an orchestrator.

Once bound, everything that changes (status, info, backend id) is read
through the transport, never kept on the object, and every operation is a
request to the state machine. Subjob objects are made on demand from their
master's definition and the splitter's delta, and kept only while someone
holds them, so a master of a million subjobs costs nothing here until
someone looks.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

from ..core.errors import JobError
from ..core.ids import FQID, fqid_str
from ..core.model import Backend, JobInfo
from ..core.statuses import ACTIVE, JobStatus, parse_status
from ..runtime.workspace import Workspace
from . import wire
from .definition import Definition
from .slices import JobCollection, JobSlice, select_statuses
from .transport import Done, Jobs, done


class _LinkedJob:
    """``Job.prejob`` and ``Job.aggregator``, one attribute per role: the linked top-level job once it exists,
    else the definition set (held by :class:`Definition` as ``_prejob`` / ``_aggregator``)."""

    def __init__(self, role: str, doc: str) -> None:
        self.held = f"_{role}"
        self.role = role
        self.__doc__ = doc

    @overload
    def __get__(self, job: None, owner: type[Job]) -> _LinkedJob: ...

    @overload
    def __get__(self, job: Job, owner: type[Job]) -> Definition | None: ...

    def __get__(self, job: Job | None, owner: type[Job]) -> Definition | None | _LinkedJob:
        if job is None:
            return self
        held: Definition | None = getattr(job, self.held)
        return job._linked(self.role) or held

    def __set__(self, job: Job, value: Definition | None) -> None:
        setattr(job, self.held, value)


class Job(Definition):
    """A job: an application, its files, a splitter, a backend (see :class:`Definition` for the fields)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.id: int | None = None
        self.parent: Job | None = None
        self._registry: Jobs | None = None
        self._removed = False
        #: Set when the job is bound: the user it belongs to (see :mod:`.owners`).
        self._owner: str | None = None
        #: Made on first use: a job never asked for its subjobs holds no reference cycle and is freed as soon as it
        #: is dropped (the service builds every definition it is sent only to check it and take its ``spec()``).
        self._subjobs: SubjobList | None = None

    # ------------------------------------------------------------ identity
    @property
    def fqid_tuple(self) -> FQID:
        if self.id is None:
            raise JobError("the job has not been added to an orchestrator yet", fqid="(new)")
        return (*self.parent.fqid_tuple, self.id) if self.parent is not None else (self.id,)

    @property
    def fqid(self) -> str:
        return fqid_str(self.fqid_tuple)

    @property
    def fqid_or_new(self) -> str:
        if self.id is None:
            return f"(new {self.name or 'job'})"
        return self.fqid

    @property
    def owner(self) -> str | None:
        """The user this job belongs to (a subjob: its master's); ``None`` until it is added."""
        return self.parent.owner if self.parent is not None else self._owner

    @property
    def master(self) -> Job | None:
        """Ganga's name for ``parent``."""
        return self.parent

    @property
    def registry(self) -> Jobs:
        if self._registry is None:
            if self._removed or (self.parent is not None and self.parent._removed):
                raise JobError("was removed", fqid=self.fqid_or_new)
            raise JobError("the job has not been added to an orchestrator (await orch.jobs.add(job))",
                           fqid=self.fqid_or_new)
        return self._registry

    # ------------------------------------------------------------ state, read through the transport
    @property
    def status(self) -> JobStatus:
        if self._registry is None:
            return JobStatus.NEW
        return self._registry.transport.statuses().status(self.fqid_tuple)

    @property
    def subjobs(self) -> SubjobList:
        if self._subjobs is None:
            self._subjobs = SubjobList(self)
        return self._subjobs

    @property
    def info(self) -> JobInfo:
        if self._registry is None:
            return JobInfo()
        return JobInfo.from_dict(self._registry.transport.read(wire.InfoRequest(fqid=self.fqid)))

    @property
    def backend_id(self) -> str | None:
        if self._registry is None:
            return None
        found: str | None = self._registry.transport.read(wire.BackendIdRequest(fqid=self.fqid))
        return found

    @property
    def comment(self) -> str:
        return self._comment

    @comment.setter
    def comment(self, value: str) -> None:
        if not isinstance(value, str):
            raise JobError("comment must be a string", fqid=self.fqid_or_new, field="comment")
        self._comment = value
        self._annotate()

    @property
    def metadata(self) -> dict[str, Any]:
        return self._metadata

    @metadata.setter
    def metadata(self, value: dict[str, Any]) -> None:
        from .validate import check_metadata

        check_metadata(value, self.fqid_or_new)
        self._metadata = copy.deepcopy(dict(value))
        self._annotate()

    def _annotate(self) -> None:
        if self._registry is not None and self.parent is None:
            self._registry.transport.read(wire.AnnotateRequest(job=self.fqid_tuple[0], comment=self._comment,
                                                               metadata=self._metadata))

    prejob = _LinkedJob("prejob", "The pre-job: once submitted, the top-level job that runs it (else its definition).")
    aggregator = _LinkedJob("aggregator",
                            "The aggregator: once started, the top-level job that runs it (else its definition).")

    def _linked(self, role: str) -> Job | None:
        if self._registry is None or self.parent is not None:
            return None
        job_id = self.info.partition.get(role)
        return self._registry.get(job_id) if job_id is not None else None

    @property
    def workspace(self) -> Path:
        """This job's directory: ``workspace/<id>`` or ``workspace/<id>/<i>`` under the home (or the shared
        directory of a shared repository)."""
        return self._layout.jobdir(self.fqid_tuple)

    @property
    def inputdir(self) -> Path:
        return self._layout.inputdir(self.fqid_tuple)

    @property
    def outputdir(self) -> Path:
        return self._layout.outputdir(self.fqid_tuple)

    @property
    def _layout(self) -> Workspace:
        """The job directories as the runtime lays them out: one layout, in :mod:`orchestrator.runtime.workspace`."""
        return Workspace(self.registry.transport.workspace)

    def is_active(self) -> bool:
        """Something of this job is submitting, submitted, running or completing."""
        return self._registry is not None and self._registry.transport.statuses().active(self.fqid_tuple)

    # ------------------------------------------------------------ operations
    async def submit(self, keep_going: bool = False) -> Done:
        """Split and submit a new top-level job; the answer says how many jobs it acted on."""
        return await JobSlice([self]).submit(keep_going=keep_going)

    async def kill(self, keep_going: bool = False) -> Done:
        """Kill it (a master: every active subjob); the answer's ``acted`` is 0 when there was nothing to kill."""
        return await JobSlice([self]).kill(keep_going=keep_going)

    async def resubmit(self, only_failed: bool = True, backend: str | Backend | None = None,
                       keep_going: bool = False, from_state: str | None = None) -> Done:
        """Run again. ``from_state``: the text of a saved state (``orchestrator checkpoint get``) to start from."""
        return await JobSlice([self]).resubmit(only_failed=only_failed, backend=backend, keep_going=keep_going,
                                               from_state=from_state)

    async def release(self, retry_args: Sequence[str] | None = None) -> Done:
        """Resume a held job; ``retry_args`` reach it as ``ORCH_RETRY_ARG_1..n`` (else the hold's own data)."""
        return await JobSlice([self]).release(retry_args)

    async def force_status(self, status: str | JobStatus, force: bool = False) -> Done:
        """Mark a stuck job ``failed`` or ``completed``; an active one is killed first unless ``force``."""
        return await JobSlice([self]).force_status(status, force=force)

    async def merge(self) -> Done:
        """Run an ended master's postprocessors again over every subjob (they replace their earlier output); once
        resubmitted subjobs end they run again by themselves, as Ganga's do."""
        return done(await self.registry.transport.handle(wire.MergeRequest(targets=wire.Fqids([self.fqid_tuple]))))

    async def copy(self) -> Job:
        """A new top-level ``new`` job with the same definition, sharing no object with this one."""
        twin: Job = (await JobSlice([self]).copy())[0]
        return twin

    async def remove(self) -> Done:
        return await JobSlice([self]).remove()

    async def wait(self, timeout: float | None = None) -> None:
        """Return once nothing of the job is active (no subjob submitting, submitted, running or completing)."""
        await JobSlice([self]).wait(timeout)

    async def peek(self, name: str = "stdout", tail: int | None = None) -> str:
        """The text of a file of the run: its output dir once ended, its work dir while it runs."""
        request = wire.PeekRequest(fqid=self.fqid, name=name, tail=tail)
        return str((await self.registry.transport.handle(request))["text"])

    async def states(self) -> list[dict[str, Any]]:
        """The checkpoint states kept for this job or subjob, oldest first (label ``fqid:seq``)."""
        return list(await self.registry.transport.handle(wire.StatesRequest(fqid=self.fqid)))

    async def story(self) -> list[dict[str, Any]]:
        """What happened to this job or subjob lately, oldest first: see :meth:`Orchestrator.story`."""
        return list(await self.registry.transport.handle(wire.StoryRequest(fqid=self.fqid)))

    # ------------------------------------------------------------ definitions
    def template(self) -> Job:
        """A detached copy of the whole definition (shares no object with this job)."""
        twin = Job()
        Definition.load(twin, self.name, self.spec())
        return twin

    def _stored_splitter(self) -> dict[str, Any] | None:
        if self.id is None:
            raise JobError("has no stored splitter", fqid=self.fqid_or_new, field="splitter")
        found: dict[str, Any] | None = self.registry.transport.read(wire.SplitterSpecRequest(job=self.id))
        return found

    @classmethod
    def from_spec(cls, name: str, spec: dict[str, Any]) -> Job:
        job = cls()
        job.load(name, spec)
        return job

    def __repr__(self) -> str:
        ident = self.fqid if self.id is not None else "new"
        return f"<Job {ident} {self.name!r} {self.status.value} on {self.backend.name}>"


class SubjobList(JobCollection):
    """A master's subjobs: ``j.subjobs[i]``, ``j.subjobs(i)``, ``select()``, ``len()``.

    A subjob object is made on first access and kept while someone holds it,
    so the same index gives the same object as long as it is in use.
    """

    def __init__(self, master: Job) -> None:
        self._master = master
        self._built: weakref.WeakValueDictionary[int, Job] = weakref.WeakValueDictionary()

    def __len__(self) -> int:
        m = self._master
        if m._registry is None or m.parent is not None or m.id is None:
            return 0
        return m._registry.transport.statuses().n_subjobs(m.id)

    def build(self, indexes: Sequence[int]) -> list[Job]:
        """The subjobs at ``indexes`` (their definitions read in one go where they are not built yet)."""
        m = self._master
        assert m.id is not None and m._registry is not None
        out: list[Job] = []
        missing: list[int] = []
        for i in indexes:
            sub = self._built.get(i)
            out.append(sub)  # type: ignore[arg-type]  # filled below where None
            if sub is None:
                missing.append(i)
        if missing:
            got = m._registry.transport.read(wire.SubjobSpecsRequest(job=m.id, indexes=missing))
            specs = {int(k): v for k, v in got.items()}  # through a service, the keys are strings
            made = {}
            for i in missing:
                spec = specs[i]
                sub = Job.from_spec(spec.pop("name", None) or m.name, spec)
                sub.id, sub.parent, sub._registry = i, m, m._registry
                self._built[i] = made[i] = sub
            out = [made[i] if job is None else job for i, job in zip(indexes, out, strict=True)]
        return out

    def _get(self, index: int) -> Job:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"job {self._master.fqid_or_new} has no subjob {index} (it has {n})")
        return self.build([index])[0]

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return JobSlice(self.build(list(range(len(self))[index])))
        return self._get(index)

    def __call__(self, index: int) -> Job:
        return self._get(index)

    def __iter__(self) -> Iterator[Job]:
        n = len(self)
        for start in range(0, n, 1000):  # a page at a time: a million subjobs are never all held
            yield from self.build(range(start, min(start + 1000, n)))

    def __bool__(self) -> bool:
        return len(self) > 0

    def __repr__(self) -> str:
        return f"<{len(self)} subjobs of job {self._master.fqid_or_new}>"

    def select(self, minid: Any = None, maxid: int | None = None, *, ids: Any = None, status: Any = None,
               name: str | None = None, backend: str | None = None, application: str | None = None,
               since: Any = None, until: Any = None, owner: str | None = None) -> JobSlice:
        """Subjobs by index, status, name glob...: a slice that counts from the counters, and builds its jobs
        only when iterated; ``select(minid, maxid)`` keeps the indexes from ``minid`` to ``maxid`` inclusive.
        (``owner``: every subjob is its master's, so all or none.)"""
        from .slices import SubjobSelection, id_filter

        ids = id_filter(minid, maxid, ids)
        if len(self) == 0 or (owner is not None and self._master.owner != owner):
            return JobSlice([])
        return SubjobSelection(self, ids=ids, status=select_statuses(status), name=name, backend=backend,
                               application=application, since=since, until=until)

    async def kill(self, keep_going: bool = False) -> None:
        await self.select().kill(keep_going=keep_going)

    async def resubmit(self, keep_going: bool = False, backend: str | Backend | None = None) -> None:
        await self.select().resubmit(keep_going=keep_going, backend=backend)


__all__ = ["ACTIVE", "Job", "SubjobList", "parse_status"]
