"""The embedded transport: the API over a runtime in this process.

Reads answer from the state machine and the definitions (and, for a
subjob's definition or backend id, the repository's reader); operations are
requests on the bus, answered by the state machine.

It acts as one :class:`~.owners.Caller`: this process's user, an admin, for
an orchestrator opened here; the client of each request in a service, which
makes a view per caller with :meth:`Embedded.as_caller`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio

from ..core.errors import JobError, Lagging, WaitTimeout
from ..core.events import (
    ForceStatusRequested,
    KillRequested,
    MergeRequested,
    ReleaseRequested,
    RemoveRequested,
    ResubmitRequested,
    SubmitRequested,
)
from ..core.ids import FQID, fqid_str
from ..core.instructions import Reply
from ..core.model import Backend
from ..core.splitters import apply_delta
from ..core.statuses import JobStatus
from ..plugin.users import OwnerError, identity
from ..runtime.recipients import check_spec
from ..runtime.runtime import Runtime
from .definition import subjob_part
from .owners import OWNER_KEY, Caller, OwnerBook, current_user, home_owner, refusal, visible_to
from .peek import read_file
from .transport import Done, JobRecord


class Embedded:
    """See the module docstring."""

    def __init__(self, runtime: Runtime, caller: Caller | None = None, owners: OwnerBook | None = None) -> None:
        self.runtime = runtime
        self.home: Path = runtime.home
        self.workspace: Path = runtime.workspace.root
        self.caller = caller if caller is not None else Caller(current_user(), admin=True)
        self.owners = owners if owners is not None else OwnerBook(runtime.definitions.specs, home_owner(self.home))

    def as_caller(self, caller: Caller) -> Embedded:
        """The same runtime, seen and acted on by ``caller``."""
        return Embedded(self.runtime, caller, self.owners)

    # ------------------------------------------------------------ owners
    def _mine(self, job: int) -> bool:
        return self.caller.admin or self.owners.owner(job) == self.caller.name

    def _check(self, targets: Sequence[FQID]) -> None:
        """Refuse, naming the owner, when a target is another user's job."""
        if self.caller.admin:
            return
        for job in {fq[0] for fq in targets}:
            owner = self.owner_of(job)
            if owner is not None and owner != self.caller.name:
                raise refusal(next(fq for fq in targets if fq[0] == job), owner, self.caller)

    def owner_of(self, job: int) -> str | None:
        return self.owners.owner(job) if (job,) in self.runtime.sm else None

    # ------------------------------------------------------------ reads
    def job_ids(self) -> list[int]:
        ids = self.runtime.sm.job_ids()
        return ids if self.caller.admin else [j for j in ids if self._mine(j)]

    def record(self, job: int) -> JobRecord:
        defs = self.runtime.definitions
        return JobRecord(job, defs.names.get(job, ""), defs.spec(job), self.runtime.sm.created(job),
                         self.owners.owner(job) or "")

    def exists(self, fq: FQID) -> bool:
        return fq in self.runtime.sm and self._mine(fq[0])

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

    def info(self, fq: FQID) -> dict[str, Any]:
        return self.runtime.sm.info(fq)

    def infos(self, fqs: Sequence[FQID]) -> list[dict[str, Any]]:
        return [self.runtime.sm.info(fq) for fq in fqs]

    def splitter_spec(self, job: int) -> dict[str, Any] | None:
        return self.runtime.definitions.splitter(job)

    def backend_id(self, fq: FQID) -> str | None:
        return self.runtime.writer.backend_id(fq[0], fq[1] if len(fq) == 2 else None)

    def subjob_specs(self, job: int, indexes: Sequence[int]) -> dict[int, dict[str, Any]]:
        defs = self.runtime.definitions
        master = subjob_part(defs.spec(job))
        return {i: apply_delta(master, delta) for i, delta in defs.deltas(job, indexes).items()}

    # ------------------------------------------------------------ operations
    def _check_recipients(self, spec: dict[str, Any], fqid: str) -> None:
        """A notification may mail its owner, and whom ``[postprocess] allowed_recipients`` lists: nothing else."""
        check_spec(spec, self.caller.name, self.runtime.config.section("postprocess"), fqid)

    async def add(self, name: str, spec: dict[str, Any]) -> int:
        self._check_recipients(spec, f"(new {name or 'job'})")
        return await self.runtime.add(name, {**spec, OWNER_KEY: self.caller.name})  # whoever adds it owns it

    async def _ask(self, make: Any, kind: str) -> Done:
        reply: Reply = await self.runtime.request(make, kind)
        if reply.error is not None:
            raise reply.error
        return Done(reply.acted)

    async def submit(self, targets: Sequence[FQID], keep_going: bool,
                     definitions: dict[int, tuple[str, dict[str, Any]]] | None = None) -> Done:
        self._check(targets)
        profiles = {}
        for job, (name, spec) in (definitions or {}).items():
            if self.exists((job,)) and self.status((job,)) == JobStatus.NEW:
                stored = self.runtime.definitions.spec(job).get(OWNER_KEY)
                spec = {k: v for k, v in spec.items() if k != OWNER_KEY}  # never taken from a client
                if stored is not None:
                    spec[OWNER_KEY] = stored
                check_spec(spec, str(stored or self.owners.default), self.runtime.config.section("postprocess"),
                           str(job))
                self.runtime.definitions.add(job, name, spec)
                self.runtime.definitions.dirty.add(job)
                profiles[job] = self.runtime.definitions.profile(job)
        return await self._ask(lambda sid: SubmitRequested(stimulus_id=sid, time=time.time(), targets=tuple(targets),
                                                           keep_going=keep_going, profiles=profiles), "submit")

    async def kill(self, targets: Sequence[FQID], keep_going: bool) -> Done:
        self._check(targets)
        return await self._ask(lambda sid: KillRequested(stimulus_id=sid, time=time.time(), targets=tuple(targets),
                                                         keep_going=keep_going), "kill")

    async def resubmit(self, targets: Sequence[FQID], *, only_failed: bool, keep_going: bool,
                       backend: dict[str, Any] | None, from_state: str | None) -> Done:
        self._check(targets)
        defs = self.runtime.definitions
        profile = None
        chosen = None
        if backend is not None:
            chosen = Backend.from_dict(backend)
            job = targets[0][0]
            profile = defs.profile(job, {**defs.spec(job), "backend": chosen.to_dict()})
        if from_state is not None and any(len(fq) == 1 and self.runtime.sm.is_master(fq[0]) for fq in targets):
            raise JobError("a state belongs to one run: resubmit one subjob (ID.i) from it",
                           fqid=".".join(map(str, targets[0])), field="from_state")
        if from_state is not None:
            from ..checkpoint import State, StateError

            try:
                State.from_text(from_state, fqid=".".join(map(str, targets[0])))
            except StateError as exc:
                raise JobError(f"not a state: {exc}", fqid=".".join(map(str, targets[0])),
                               field="from_state") from None

        def make(sid: str) -> ResubmitRequested:
            if from_state is not None:
                self.runtime.given_state(sid, from_state)
            return ResubmitRequested(stimulus_id=sid, time=time.time(), targets=tuple(targets), keep_going=keep_going,
                                     only_failed=only_failed, profile=profile, backend=chosen,
                                     start="given" if from_state is not None else "initial")

        return await self._ask(make, "resubmit")

    async def release(self, targets: Sequence[FQID], retry_args: Sequence[str] | None) -> Done:
        self._check(targets)
        args = tuple(str(a) for a in retry_args) if retry_args is not None else None
        return await self._ask(lambda sid: ReleaseRequested(stimulus_id=sid, time=time.time(), targets=tuple(targets),
                                                            retry_args=args), "release")

    async def force_status(self, targets: Sequence[FQID], status: JobStatus, force: bool, keep_going: bool) -> Done:
        self._check(targets)
        return await self._ask(lambda sid: ForceStatusRequested(stimulus_id=sid, time=time.time(),
                                                                targets=tuple(targets), status=status, force=force,
                                                                keep_going=keep_going), "force")

    async def remove(self, targets: Sequence[FQID], keep_going: bool) -> Done:
        self._check(targets)
        return await self._ask(lambda sid: RemoveRequested(stimulus_id=sid, time=time.time(), targets=tuple(targets),
                                                           keep_going=keep_going), "remove")

    async def merge(self, targets: Sequence[FQID]) -> Done:
        self._check(targets)
        return await self._ask(lambda sid: MergeRequested(stimulus_id=sid, time=time.time(), targets=tuple(targets)),
                               "merge")

    async def wait(self, targets: Sequence[FQID], timeout: float | None) -> None:
        self._check(targets)
        sm = self.runtime.sm
        try:
            await self.runtime.wait_until(lambda: not any(sm.active(fq) for fq in targets), timeout)
        except TimeoutError:
            active = [fqid_str(fq) for fq in targets if sm.active(fq)]
            raise WaitTimeout(active or [fqid_str(fq) for fq in targets], timeout) from None
        await self.runtime.writer.flush()  # what a caller is told has ended is on disk

    async def peek(self, fq: FQID, name: str, tail: int | None) -> str:
        self._check([fq])
        if not self.exists(fq):
            raise JobError("no such job", fqid=fqid_str(fq))
        status = self.status(fq)
        jobdir = self.workspace.joinpath(*map(str, fq))
        try:
            owner = identity(self.owners.owner(fq[0]))
        except OwnerError as exc:
            raise JobError(str(exc), fqid=fqid_str(fq)) from None
        read = functools.partial(read_file, jobdir, name, tail, running=status in (JobStatus.RUNNING,
                                 JobStatus.COMPLETING), fqid=".".join(map(str, fq)), owner=owner)
        return read() if owner is None else await anyio.to_thread.run_sync(read)

    async def states(self, fq: FQID) -> list[dict[str, Any]]:
        self._check([fq])
        await self.runtime.writer.flush()
        rows = await self.runtime.repo.states(".".join(map(str, fq)))
        return [{"job": r.job, "seq": r.seq, "time": r.time, "final": r.final, "data": r.data} for r in rows]

    async def story(self, fq: FQID) -> list[dict[str, Any]]:
        self._check([fq])
        if not self.exists(fq):
            raise JobError("no such job", fqid=fqid_str(fq))
        return self.runtime.story.of(fq)

    def annotate(self, job: int, comment: str | None, metadata: dict[str, Any] | None) -> None:
        self._check([(job,)])
        spec = self.runtime.definitions.spec(job)
        if comment is not None:
            spec["comment"] = comment
        if metadata is not None:
            spec["metadata"] = metadata
        self.runtime.definitions.dirty.add(job)

    async def events(self) -> AsyncIterator[Any]:
        stream = self.runtime.bus.subscribe()
        visible = visible_to(self.caller, self.owners.owner)
        async with stream:
            async for item in stream:
                if isinstance(item, Lagging):
                    raise item
                if visible(item):
                    yield item

    async def refresh(self) -> None:
        await self.runtime.refresh()

    async def metrics(self) -> dict[str, Any]:
        return self.runtime.metrics()
