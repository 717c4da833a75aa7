"""``orch.jobs``: look jobs up, select them, add new ones.

Look-ups (docs/design.md, both editions): ``orch.jobs[3]``, ``orch.jobs(3)``,
``orch.jobs[3, 1]``, ``orch.jobs((3, 1))``, ``orch.jobs["3.1"]``;
``orch.jobs[-1]`` and ``orch.jobs[a:b]`` by position in id order, as a list
is indexed; ``orch.jobs["name"]`` the one job of that name. The same object
comes back for the same job as long as the orchestrator is open.

Only the caller's jobs are there (every job for an admin, :mod:`.owners`):
listings leave the others' out, and looking one of them up by id is refused
with a :class:`~orchestrator.core.errors.NotOwnerError` naming its owner.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..core.errors import JobError, UnknownJobError
from ..core.ids import FQID, fqid_str, parse_fqid
from . import wire
from .job import Job
from .owners import refusal
from .slices import JobSlice
from .transport import Transport
from .validate import validate


class JobRegistry:
    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self._tops: dict[int, Job] = {}

    async def add(self, job: Job) -> Job:
        """Register ``job``; it gets the next integer id and status ``new``."""
        if job._registry is not None or job.parent is not None:
            raise JobError("is already registered", fqid=job.fqid_or_new)
        validate(job, job.fqid_or_new)
        request = wire.AddRequest(name=job.name, spec=wire.job_spec(job.spec(), f"(new {job.name or 'job'})"))
        job_id = int((await self.transport.handle(request))["id"])
        job.id, job._registry = job_id, self
        job._owner = self.transport.statuses().record(job_id).owner
        self._tops[job_id] = job
        return job

    # ------------------------------------------------------------ look-ups
    def top(self, job_id: int) -> Job:
        job = self._tops.get(job_id)
        if job is None:
            if not self.transport.statuses().exists((job_id,)):
                raise self.missing((job_id,))
            record = self.transport.statuses().record(job_id)
            job = Job.from_spec(record.name, record.spec)
            job.id, job._registry, job._owner = job_id, self, record.owner
            self._tops[job_id] = job
        return job

    def missing(self, fq: FQID) -> JobError:
        """Why ``fq`` cannot be had: another user's job (the refusal names the owner), or none at all."""
        owner = self.transport.statuses().owner(fq[0])
        if owner is not None and not self.transport.caller.may(owner):
            return refusal(fq, owner, self.transport.caller)
        return UnknownJobError(f"no job {fqid_str(fq)}", fqid=fqid_str(fq))

    def lookup(self, fq: FQID) -> Job:
        if not self.transport.statuses().exists(fq):
            raise self.missing(fq)
        job = self.top(fq[0])
        if len(fq) == 2:
            return job.subjobs(fq[1])
        return job

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, bool):
            raise KeyError(f"not a job id: {key!r}")
        if isinstance(key, int) and key < 0 or isinstance(key, slice):
            ids = self.transport.statuses().job_ids()
            if isinstance(key, slice):
                return JobSlice(self.top(i) for i in ids[key])
            try:
                return self.top(ids[key])
            except IndexError:
                raise UnknownJobError(f"no job at position {key} (there are {len(ids)})") from None
        if isinstance(key, str) and not _looks_like_id(key):
            return self.by_name(key)
        try:
            fq = parse_fqid(key)
        except ValueError as exc:
            raise KeyError(str(exc)) from None
        return self.lookup(fq)

    def by_name(self, name: str) -> Job:
        found = [j for j in self if j.name == name]
        if len(found) != 1:
            ids = ", ".join(j.fqid for j in found)
            if not found:
                raise UnknownJobError(f"no job is named {name!r}", field="name")
            raise JobError(f"{len(found)} jobs are named {name!r} ({ids}): use an id", field="name")
        return found[0]

    def __call__(self, key: Any) -> Any:
        return self[key]

    def get(self, key: Any, default: Job | None = None) -> Job | None:
        try:
            return self[key]  # type: ignore[no-any-return]
        except (KeyError, JobError):
            return default

    def __contains__(self, key: Any) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return len(self.transport.statuses().job_ids())

    def __iter__(self) -> Iterator[Job]:
        return iter([self.top(i) for i in self.transport.statuses().job_ids()])

    def select(self, minid: Any = None, maxid: int | None = None, *, ids: Any = None, status: Any = None,
               name: str | None = None, backend: str | None = None, application: str | None = None,
               since: Any = None, until: Any = None, owner: str | None = None) -> JobSlice:
        """Top-level jobs by every filter given (combined with and); ``select(minid, maxid)`` keeps the ids from
        ``minid`` to ``maxid`` inclusive, as Ganga's ``jobs.select``; see :mod:`.slices`."""
        jobs = JobSlice(self)
        return jobs.select(minid, maxid, ids=ids, status=status, name=name, backend=backend, application=application,
                           since=since, until=until, owner=owner)

    def forget(self, job: Job) -> None:
        """A removed job: no longer looked up; what is still held of it says it was removed."""
        if job.id is not None:
            self._tops.pop(job.id, None)
        job._registry = None
        job._removed = True

    def __repr__(self) -> str:
        return f"<{len(self)} jobs>"


def _looks_like_id(text: str) -> bool:
    parts = text.strip().split(".")
    return bool(parts) and all(p.isascii() and p.isdigit() for p in parts)
