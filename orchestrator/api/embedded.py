"""The embedded transport: the API over a runtime in this process.

``handle`` dispatches a request by its type through one table
(:data:`HANDLERS`) to its handler, as the core dispatches events: reads
answer from the state machine and the definitions (and, for a subjob's
definition or backend id, the repository's reader); operations are requests
on the bus, answered by the state machine. A request made in this process
names its jobs as tuples (:class:`~.wire.Fqids`), so a slice of a million
subjobs is never turned into strings; one decoded by the service names them
as strings, parsed here.

A job definition arrives as the wire's :class:`~.wire.JobSpec`: the job is
built from it and checked as ``orch.jobs.add()`` checks it (:func:`built`),
whoever sent it, and only what was built is stored.

It acts as one :class:`~.owners.Caller`: this process's user, an admin, for
an orchestrator opened here; the client of each request in a service, which
makes a view per caller with :meth:`Embedded.as_caller`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec

from ..core import events as ev
from ..core.errors import JobError, Lagging
from ..core.ids import FQID, fqid_str, parse_fqid
from ..core.instructions import Reply
from ..core.model import Backend
from ..core.splitters import apply_delta
from ..core.statuses import JobStatus, parse_status
from ..plugin.users import OwnerError, identity
from ..runtime.recipients import check_spec
from ..runtime.runtime import Runtime
from . import wire
from .definition import subjob_part, without_splitter
from .owners import OWNER_KEY, Caller, OwnerBook, current_user, home_owner, refusal, visible_to
from .peek import read_file
from .transport import JobRecord

#: Status codes (0-9) as the digits of a string (a master's subjobs in a ``describe``).
DIGITS = bytes.maketrans(bytes(range(10)), b"0123456789")


def built(name: str, spec: dict[str, Any], fqid: str | None) -> Any:
    """A job built from a definition and checked as ``orch.jobs.add()`` checks it (``fqid``: the job's,
    ``None`` for a new one): the service trusts no one, and stores only what it built (``job.spec()``), never
    what it was sent."""
    from .job import Job
    from .validate import validate

    try:
        job = Job.from_spec(name, spec)
        validate(job, fqid or job.fqid_or_new)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise JobError(f"unreadable job definition: {type(exc).__name__}: {exc}", fqid=fqid or "(new)") from None
    return job


def built_spec(name: str, spec: dict[str, Any], fqid: str | None) -> dict[str, Any]:
    """The definition of the job :func:`built` (``job.spec()``); the job is freed on return (it holds no cycle
    until asked for its subjobs), and with it its splitter's copy of every argument list."""
    from .validate import check_spec_json

    out: dict[str, Any] = built(name, spec, fqid).spec()
    check_spec_json(out, fqid or "(new)")
    return out


class Live:
    """The statuses as the state machine holds them now (:class:`~.transport.Statuses`), seen by a caller."""

    def __init__(self, runtime: Runtime, caller: Caller, owners: OwnerBook) -> None:
        self.runtime, self.caller, self.owners = runtime, caller, owners

    def mine(self, job: int) -> bool:
        return self.caller.admin or self.owners.owner(job) == self.caller.name

    def owner(self, job: int) -> str | None:
        return self.owners.owner(job) if (job,) in self.runtime.sm else None

    def job_ids(self) -> list[int]:
        ids = self.runtime.sm.job_ids()
        return ids if self.caller.admin else [j for j in ids if self.mine(j)]

    def record(self, job: int) -> JobRecord:
        defs = self.runtime.definitions
        return JobRecord(job, defs.names.get(job, ""), defs.spec(job), self.runtime.sm.created(job),
                         self.owners.owner(job) or "")

    def exists(self, fq: FQID) -> bool:
        return fq in self.runtime.sm and self.mine(fq[0])

    def status(self, fq: FQID) -> JobStatus:
        return self.runtime.sm.status(fq)

    def n_subjobs(self, job: int) -> int:
        return self.runtime.sm.n_subjobs(job) if job in self.runtime.sm.job_ids() else 0

    def counts(self, job: int) -> dict[JobStatus, int]:
        return self.runtime.sm.counts(job)

    def indexes(self, job: int, statuses: Sequence[JobStatus]) -> list[int]:
        return self.runtime.sm.indexes(job, statuses)

    def active(self, fq: FQID) -> bool:
        return self.runtime.sm.active(fq)


class Embedded:
    """See the module docstring."""

    def __init__(self, runtime: Runtime, caller: Caller | None = None, owners: OwnerBook | None = None) -> None:
        self.runtime = runtime
        self.home: Path = runtime.home
        self.workspace: Path = runtime.workspace.root
        self.caller = caller if caller is not None else Caller(current_user(), admin=True)
        self.owners = owners if owners is not None else OwnerBook(runtime.definitions.specs, home_owner(self.home))
        self._live = Live(runtime, self.caller, self.owners)

    def as_caller(self, caller: Caller) -> Embedded:
        """The same runtime, seen and acted on by ``caller``."""
        return Embedded(self.runtime, caller, self.owners)

    # ------------------------------------------------------------ the transport
    async def handle(self, request: wire.Request) -> Any:
        """The request's handler in :data:`HANDLERS` (or :data:`READS`), by its type; an unknown type raises."""
        handler = HANDLERS.get(type(request))
        if handler is not None:
            return await handler(self, request)
        return self.read(request)

    def read(self, request: wire.Request) -> Any:
        read = READS.get(type(request))
        if read is None:
            raise wire.BadRequest(f"no handler for a {type(request).__name__} here")
        return read(self, request)

    def statuses(self) -> Live:
        return self._live

    async def events(self) -> AsyncIterator[Any]:
        stream = self.runtime.bus.subscribe()
        visible = visible_to(self.caller, self.owners.owner)
        async with stream:
            async for item in stream:
                if isinstance(item, Lagging):
                    raise item
                if visible(item):
                    yield item

    # ------------------------------------------------------------ owners
    def _check(self, targets: Sequence[FQID]) -> None:
        """Refuse, naming the owner, when a target is another user's job."""
        if self.caller.admin:
            return
        for job in {fq[0] for fq in targets}:
            owner = self._live.owner(job)
            if owner is not None and owner != self.caller.name:
                raise refusal(next(fq for fq in targets if fq[0] == job), owner, self.caller)

    def _targets(self, named: Sequence[str] | None) -> Sequence[FQID]:
        targets = wire.fqs(named)
        self._check(targets)
        return targets

    # ------------------------------------------------------------ reads
    def _describe(self, r: wire.DescribeRequest) -> dict[str, Any]:
        """Top-level jobs as the remote transport mirrors them, read between two steps (``step``)."""
        live, sm = self._live, self.runtime.sm
        ids = live.job_ids() if r.jobs is None else [j for j in r.jobs if live.exists((j,))]
        records = []
        for job in ids:
            rec = live.record(job)
            out: dict[str, Any] = {"id": rec.id, "name": rec.name, "spec": without_splitter(rec.spec),
                                   "added": rec.added, "owner": rec.owner,
                                   "status": sm.status((rec.id,)).value, "active": sm.active((rec.id,))}
            if sm.is_master(rec.id):
                out["codes"] = sm.statuses(rec.id).translate(DIGITS).decode()
            records.append(out)
        return {"step": self.runtime.bus.handled, "jobs": records, "workspace": str(self.workspace),
                "gone": [j for j in (r.jobs or ()) if not live.exists((j,))],
                "caller": {"name": self.caller.name, "admin": self.caller.admin}}

    def _owner(self, r: wire.OwnerRequest) -> dict[str, Any]:
        return {"owner": self._live.owner(r.job)}

    def _info(self, r: wire.InfoRequest) -> dict[str, Any]:
        return self.runtime.sm.info(parse_fqid(r.fqid))

    def _infos(self, r: wire.InfosRequest) -> list[dict[str, Any]]:
        return [self.runtime.sm.info(fq) for fq in wire.fqs(r.fqids)]

    def _splitter_spec(self, r: wire.SplitterSpecRequest) -> dict[str, Any] | None:
        return self.runtime.definitions.splitter(r.job)

    def _backend_id(self, r: wire.BackendIdRequest) -> str | None:
        fq = parse_fqid(r.fqid)
        return self.runtime.writer.backend_id(fq[0], fq[1] if len(fq) == 2 else None)

    def _subjob_specs(self, r: wire.SubjobSpecsRequest) -> dict[int, dict[str, Any]]:
        defs = self.runtime.definitions
        master = subjob_part(defs.spec(r.job))
        return {i: apply_delta(master, delta) for i, delta in defs.deltas(r.job, r.indexes).items()}

    def _annotate(self, r: wire.AnnotateRequest) -> dict[str, Any]:
        self._check([(r.job,)])
        spec = self.runtime.definitions.spec(r.job)
        if r.comment is not None:
            spec["comment"] = r.comment
        if r.metadata is not None:
            spec["metadata"] = r.metadata
        self.runtime.definitions.dirty.add(r.job)
        return {}

    async def _peek(self, r: wire.PeekRequest) -> dict[str, Any]:
        fq = parse_fqid(r.fqid)
        self._check([fq])
        if not self._live.exists(fq):
            raise JobError("no such job", fqid=fqid_str(fq))
        status = self._live.status(fq)
        jobdir = self.workspace.joinpath(*map(str, fq))
        try:
            owner = identity(self.owners.owner(fq[0]))
        except OwnerError as exc:
            raise JobError(str(exc), fqid=fqid_str(fq)) from None
        read = functools.partial(read_file, jobdir, r.name, r.tail, running=status in (JobStatus.RUNNING,
                                 JobStatus.COMPLETING), fqid=fqid_str(fq), owner=owner)
        return {"text": read() if owner is None else await anyio.to_thread.run_sync(read)}

    async def _states(self, r: wire.StatesRequest) -> list[dict[str, Any]]:
        fq = parse_fqid(r.fqid)
        self._check([fq])
        await self.runtime.writer.flush()
        rows = await self.runtime.repo.states(fqid_str(fq))
        return [{"job": s.job, "seq": s.seq, "time": s.time, "final": s.final, "data": s.data} for s in rows]

    async def _story(self, r: wire.StoryRequest) -> list[dict[str, Any]]:
        fq = parse_fqid(r.fqid)
        self._check([fq])
        if not self._live.exists(fq):
            raise JobError("no such job", fqid=fqid_str(fq))
        return self.runtime.story.of(fq)

    async def _metrics(self, r: wire.MetricsRequest) -> dict[str, Any]:
        return self.runtime.metrics()

    async def _refresh(self, r: wire.RefreshRequest) -> dict[str, Any]:
        await self.runtime.refresh()
        await anyio.lowlevel.checkpoint()
        return {}

    # ------------------------------------------------------------ operations
    async def _ask(self, make: Any, kind: str) -> dict[str, Any]:
        reply: Reply = await self.runtime.request(make, kind)
        if reply.error is not None:
            raise reply.error
        return {"acted": reply.acted}

    async def _ask_for(self, event: Any, kind: str, targets: Sequence[FQID], **fields: Any) -> dict[str, Any]:
        """The request event of type ``event`` on ``targets``, stamped with its stimulus id and time, asked."""
        named = tuple(targets)
        return await self._ask(lambda sid: event(stimulus_id=sid, time=time.time(), targets=named, **fields), kind)

    async def _add(self, r: wire.AddRequest) -> dict[str, Any]:
        spec = built_spec(r.name, msgspec.to_builtins(r.spec), None)
        # a notification may mail its owner, and whom [postprocess] allowed_recipients lists: nothing else
        check_spec(spec, self.caller.name, self.runtime.config.section("postprocess"), f"(new {r.name or 'job'})")
        return {"id": await self.runtime.add(r.name, {**spec, OWNER_KEY: self.caller.name})}  # the adder owns it

    async def _submit(self, r: wire.SubmitRequest) -> dict[str, Any]:
        targets = self._targets(r.targets)
        profiles = {}
        defs = self.runtime.definitions
        for key, given in (r.definitions or {}).items():
            job = int(key)
            spec = built_spec(given.name, msgspec.to_builtins(given.spec), key)  # as it is defined now
            if self._live.exists((job,)) and self._live.status((job,)) == JobStatus.NEW:
                stored = defs.spec(job).get(OWNER_KEY)
                spec.pop(OWNER_KEY, None)  # never taken from a client
                if stored is not None:
                    spec[OWNER_KEY] = stored
                check_spec(spec, str(stored or self.owners.default), self.runtime.config.section("postprocess"), key)
                defs.add(job, given.name, spec)
                defs.dirty.add(job)
                profiles[job] = defs.profile(job)
        return await self._ask_for(ev.SubmitRequested, "submit", targets, keep_going=r.keep_going, profiles=profiles)

    async def _kill(self, r: wire.KillRequest) -> dict[str, Any]:
        return await self._ask_for(ev.KillRequested, "kill", self._targets(r.targets), keep_going=r.keep_going)

    async def _resubmit(self, r: wire.ResubmitRequest) -> dict[str, Any]:
        targets = self._targets(r.targets)
        defs = self.runtime.definitions
        profile = None
        chosen = None
        if r.backend is not None:
            chosen = Backend.from_dict({"name": r.backend.name, "settings": r.backend.settings})
            from .validate import check_json

            check_json(chosen.to_dict(), fqid_str(targets[0]), "backend")
            job = targets[0][0]
            profile = defs.profile(job, {**defs.spec(job), "backend": chosen.to_dict()})
        from_state = r.from_state
        if from_state is not None and any(len(fq) == 1 and self.runtime.sm.is_master(fq[0]) for fq in targets):
            raise JobError("a state belongs to one run: resubmit one subjob (ID.i) from it",
                           fqid=fqid_str(targets[0]), field="from_state")
        if from_state is not None:
            from ..checkpoint import State, StateError

            try:
                State.from_text(from_state, fqid=fqid_str(targets[0]))
            except StateError as exc:
                raise JobError(f"not a state: {exc}", fqid=fqid_str(targets[0]), field="from_state") from None

        def make(sid: str) -> ev.ResubmitRequested:
            if from_state is not None:
                self.runtime.given_state(sid, from_state)
            return ev.ResubmitRequested(stimulus_id=sid, time=time.time(), targets=tuple(targets),
                                     keep_going=r.keep_going, only_failed=r.only_failed, profile=profile,
                                     backend=chosen, start="given" if from_state is not None else "initial")

        return await self._ask(make, "resubmit")

    async def _release(self, r: wire.ReleaseRequest) -> dict[str, Any]:
        args = tuple(str(a) for a in r.retry_args) if r.retry_args is not None else None
        return await self._ask_for(ev.ReleaseRequested, "release", self._targets(r.targets), retry_args=args)

    async def _force_status(self, r: wire.ForceStatusRequest) -> dict[str, Any]:
        targets = self._targets(r.targets)
        return await self._ask_for(ev.ForceStatusRequested, "force", targets, status=parse_status(r.status),
                                   force=r.force, keep_going=r.keep_going)

    async def _remove(self, r: wire.RemoveRequest) -> dict[str, Any]:
        return await self._ask_for(ev.RemoveRequested, "remove", self._targets(r.targets), keep_going=r.keep_going)

    async def _merge(self, r: wire.MergeRequest) -> dict[str, Any]:
        return await self._ask_for(ev.MergeRequested, "merge", self._targets(r.targets))

    async def _wait(self, r: wire.WaitRequest) -> dict[str, Any]:
        """Once nothing of the jobs is active, or after ``timeout``: ``timed_out`` says which, and ``active``
        names the jobs still active then."""
        targets = list(dict.fromkeys(self._targets(r.targets)))
        sm = self.runtime.sm
        left = targets

        def done() -> bool:  # asked after every step of anyone's: the targets still active are looked at only
            nonlocal left
            left = [fq for fq in left if sm.active(fq)]
            if not left:  # then all of them once more (one that ended may have gone again meanwhile)
                left = [fq for fq in targets if sm.active(fq)]
            return not left

        try:
            await self.runtime.wait_until(done, r.timeout)
        except TimeoutError:
            active = [fqid_str(fq) for fq in targets if sm.active(fq)]
            return {"acted": 0, "timed_out": True, "active": active or [fqid_str(fq) for fq in targets]}
        await self.runtime.writer.flush()  # what a caller is told has ended is on disk
        return {"acted": 0, "timed_out": False}


#: The handler of each request type that may wait (an operation, a read of files or of the repository).
HANDLERS: dict[type[wire.Request], Callable[[Embedded, Any], Awaitable[Any]]] = {
    wire.AddRequest: Embedded._add, wire.SubmitRequest: Embedded._submit, wire.KillRequest: Embedded._kill,
    wire.ResubmitRequest: Embedded._resubmit, wire.ReleaseRequest: Embedded._release,
    wire.ForceStatusRequest: Embedded._force_status, wire.RemoveRequest: Embedded._remove,
    wire.MergeRequest: Embedded._merge, wire.WaitRequest: Embedded._wait, wire.PeekRequest: Embedded._peek,
    wire.StatesRequest: Embedded._states, wire.StoryRequest: Embedded._story, wire.MetricsRequest: Embedded._metrics,
    wire.RefreshRequest: Embedded._refresh,
}
#: The handler of each request answered at once (``Transport.read``; ``handle`` answers them too).
READS: dict[type[wire.Request], Callable[[Embedded, Any], Any]] = {
    wire.DescribeRequest: Embedded._describe, wire.OwnerRequest: Embedded._owner, wire.InfoRequest: Embedded._info,
    wire.InfosRequest: Embedded._infos, wire.SplitterSpecRequest: Embedded._splitter_spec,
    wire.BackendIdRequest: Embedded._backend_id, wire.SubjobSpecsRequest: Embedded._subjob_specs,
    wire.AnnotateRequest: Embedded._annotate,
}
