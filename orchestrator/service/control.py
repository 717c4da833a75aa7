"""The control adapter: the transport's calls as JSON, for the service's HTTP API.

Each method takes and returns plain JSON values and calls the service's own
embedded transport; the remote transport (:mod:`orchestrator.api.remote`)
calls these over the socket. So an operation has one implementation, and
the API behaves the same through a service as embedded.

Job ids travel as fqid strings (``"3"``, ``"3.1"``); statuses as their names;
a master's subjob statuses as one string of digits (their codes), so that a
client can mirror a master of a million subjobs in one answer. An operation
names its jobs with ``targets`` (a list), or one with ``fqid``; naming one, it
answers with that job's summary (as ``jobs`` lists it) and ``acted``.

``jobs`` and ``show`` are the records the CLI prints (:mod:`orchestrator.api.views`),
for clients that speak HTTP alone (the status page, ``curl``).

Each request is answered by the view of its caller (:meth:`Control.as_caller`):
its transport sees that user's jobs only (every job for an admin), so a job
of another user is left out of listings, and naming one is refused with a
:class:`~orchestrator.core.errors.NotOwnerError` that says whose it is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import anyio

from ..api import views
from ..api.definition import without_splitter
from ..api.embedded import Embedded
from ..api.job import Job
from ..api.owners import Caller
from ..api.registry import JobRegistry
from ..api.validate import checked_backend, validate
from ..api.wire import BadRequest
from ..core.errors import JobError, UnknownJobError, WaitTimeout
from ..core.ids import FQID, fqid_str, parse_fqid
from ..core.model import Backend
from ..core.statuses import JobStatus, parse_status
from .quotas import Quotas

#: Status codes (0-9) as the digits of a string.
_DIGITS = bytes.maketrans(bytes(range(10)), b"0123456789")


def _fq(value: Any) -> FQID:
    try:
        return parse_fqid(value)
    except ValueError:
        raise UnknownJobError(f"no job {value}", fqid=str(value)) from None


def _built(name: str, spec: dict[str, Any], fqid: str | None) -> Job:
    """A job built from a client's definition and checked as ``orch.jobs.add()`` checks it (``fqid``: the
    job's, ``None`` for a new one): the service trusts no one, and stores only what it built (``job.spec()``),
    never what it was sent."""
    try:
        job = Job.from_spec(name, spec)
        validate(job, fqid or job.fqid_or_new)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise JobError(f"unreadable job definition: {type(exc).__name__}: {exc}", fqid=fqid or "(new)") from None
    return job


class Control:
    """See the module docstring. ``step`` tells how many events the service has handled (a snapshot's age)."""

    def __init__(self, transport: Embedded, quotas: Quotas | None = None) -> None:
        #: The caller's embedded transport: every call ends there.
        self.transport = transport
        #: The caller's jobs, built as the API builds them, for the views that answer with summaries.
        self.registry = JobRegistry(transport)
        self._views: dict[Caller, Control] = {}
        #: The service's limits (:mod:`.quotas`); ``None``: none.
        self.quotas = quotas

    def as_caller(self, caller: Caller) -> Control:
        """The control methods as ``caller`` may use them (one view per caller, kept: its jobs stay built)."""
        if caller == self.transport.caller:
            return self
        view = self._views.get(caller)
        if view is None:
            view = self._views[caller] = Control(self.transport.as_caller(caller), self.quotas)
        return view

    def _known(self, fq: FQID) -> FQID:
        if not self.transport.exists(fq):
            raise self.registry.missing(fq)
        return fq

    def _targets(self, targets: Sequence[Any] | None, fqid: str | None = None) -> list[FQID]:
        named = list(targets or ()) + ([fqid] if fqid is not None else [])
        if not named:
            raise BadRequest("name the jobs: targets=[...] or fqid=...", field="targets")
        return [self._known(_fq(t)) for t in named]

    def _answer(self, acted: int, fqid: str | None) -> dict[str, Any]:
        if fqid is None or not self.transport.exists(_fq(fqid)):
            return {"acted": acted}
        return {**views.summary(self.registry.lookup(_fq(fqid))), "acted": acted}

    # ------------------------------------------------------------ reads
    async def jobs(self, status: Sequence[str] | None = None, name: str | None = None,
                   owner: str | None = None) -> list[dict[str, Any]]:
        """Top-level jobs as ``orchestrator jobs`` lists them (the caller's, or every one for an admin)."""
        return views.summaries(list(self.registry.select(status=list(status or ()) or None, name=name, owner=owner)))

    async def show(self, fqid: str, subjobs: int = views.SHOW_SUBJOBS) -> dict[str, Any]:
        """A job as ``orchestrator show`` shows it."""
        return views.detail(self.registry.lookup(self._known(_fq(fqid))), int(subjobs))

    async def health(self) -> dict[str, Any]:
        rt = self.transport.runtime
        return {"ok": True, "role": "active", "pid": os.getpid(), "home": str(self.transport.home),
                "workspace": str(self.transport.workspace), "jobs": len(self.transport.job_ids()),
                "monitored": sum(b["held"] for b in rt.metrics()["backends"].values()), "time": time.time()}

    async def describe(self, jobs: Sequence[int] | None = None) -> dict[str, Any]:
        """Top-level jobs as the remote transport mirrors them, read between two steps (``step``)."""
        ids = self.transport.job_ids() if jobs is None else [j for j in jobs if self.transport.exists((int(j),))]
        sm = self.transport.runtime.sm
        records = []
        for job in ids:
            rec = self.transport.record(int(job))
            out: dict[str, Any] = {"id": rec.id, "name": rec.name, "spec": without_splitter(rec.spec),
                                   "added": rec.added, "owner": rec.owner,
                                   "status": sm.status((rec.id,)).value, "active": sm.active((rec.id,))}
            if sm.is_master(rec.id):
                out["codes"] = sm.statuses(rec.id).translate(_DIGITS).decode()
            records.append(out)
        return {"step": self.transport.runtime.bus.handled, "jobs": records, "workspace": str(self.transport.workspace),
                "gone": [j for j in (jobs or ()) if not self.transport.exists((int(j),))],
                "caller": {"name": self.transport.caller.name, "admin": self.transport.caller.admin}}

    async def owner(self, job: int) -> dict[str, Any]:
        """Whose top-level job ``job`` is (``null``: no such job), for a refusal that names the owner."""
        return {"owner": self.transport.owner_of(int(job))}

    async def master(self, fqid: str, failures: int = 5000, points: int = 400) -> dict[str, Any]:
        """What a master's page shows: its runs' status codes (one digit each, :data:`_DIGITS`), its failed runs
        with their reasons (the first ``failures``), and when its runs ended, completed or failed (at most
        ``points`` times of each, evenly sampled, for the plot)."""
        fq = self._known(_fq(fqid))
        job = self.registry.lookup(fq)
        out: dict[str, Any] = {**views.summary(job), "codes": None, "failures": [], "ended": {}}
        sm = self.transport.runtime.sm
        if len(fq) > 1 or not sm.is_master(fq[0]):
            return out
        statuses = sm.statuses(fq[0])
        out["codes"] = statuses.translate(_DIGITS).decode()
        failed = [i for i, code in enumerate(statuses) if code == JobStatus.FAILED.code][:int(failures)]
        out["failures"] = [[i, reason or "failed"] for i, reason in zip(failed, sm.reasons(fq[0], failed), strict=True)]
        final = sm.final_times(fq[0])
        for status in (JobStatus.COMPLETED, JobStatus.FAILED):
            times = sorted(final[i] for i, code in enumerate(statuses) if code == status.code and final[i])
            step = max(1, len(times) // int(points))
            out["ended"][status.value] = {"n": len(times), "times": times[::step]}
        return out

    async def info(self, fqid: str) -> dict[str, Any]:
        return self.transport.info(self._known(_fq(fqid)))

    async def infos(self, fqids: Sequence[str]) -> list[dict[str, Any]]:
        return self.transport.infos([self._known(_fq(f)) for f in fqids])

    async def splitter_spec(self, job: int) -> dict[str, Any] | None:
        return self.transport.splitter_spec(self._known((int(job),))[0])

    async def backend_id(self, fqid: str) -> str | None:
        return self.transport.backend_id(self._known(_fq(fqid)))

    async def subjob_specs(self, job: int, indexes: Sequence[int]) -> dict[str, Any]:
        self._known((int(job),))
        return {str(i): spec for i, spec in self.transport.subjob_specs(int(job), [int(i) for i in indexes]).items()}

    async def peek(self, fqid: str, name: str = "stdout", tail: int | None = None) -> dict[str, Any]:
        return {"text": await self.transport.peek(self._known(_fq(fqid)), name, tail)}

    async def metrics(self) -> dict[str, Any]:
        return await self.transport.metrics()

    async def states(self, fqid: str) -> list[dict[str, Any]]:
        return await self.transport.states(self._known(_fq(fqid)))

    async def story(self, fqid: str) -> list[dict[str, Any]]:
        """What happened to a job lately, by stimulus (the caller's view: another user's job is refused)."""
        return await self.transport.story(self._known(_fq(fqid)))

    # ------------------------------------------------------------ operations
    async def add(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        job = _built(name, spec, None)
        job_id = await self.transport.add(name, job.spec())
        return {"id": job_id, **views.summary(self.registry.top(job_id))}

    async def submit(self, targets: Sequence[str] | None = None, keep_going: bool = False,
                     definitions: dict[int, Any] | None = None, fqid: str | None = None) -> dict[str, Any]:
        chosen = self._targets(targets, fqid)
        tops = {fq[0] for fq in chosen if len(fq) == 1}
        defs = {}
        for job, given in (definitions or {}).items():
            if int(job) not in tops:
                raise BadRequest(f"a definition for job {job}, which the request does not submit",
                                 fqid=str(job), field=f"definitions.{job}")
            defs[int(job)] = (given["name"], _built(given["name"], given["spec"], str(job)).spec())
        return self._answer((await self.transport.submit(chosen, keep_going, defs)).acted, fqid)

    async def kill(self, targets: Sequence[str] | None = None, keep_going: bool = False,
                   fqid: str | None = None) -> dict[str, Any]:
        return self._answer((await self.transport.kill(self._targets(targets, fqid), keep_going)).acted, fqid)

    async def resubmit(self, targets: Sequence[str] | None = None, only_failed: bool = True, keep_going: bool = False,
                       backend: dict[str, Any] | None = None, from_state: str | None = None,
                       fqid: str | None = None) -> dict[str, Any]:
        chosen = self._targets(targets, fqid)
        self.transport._check(chosen)  # another user's job: refused as not theirs before any quota is counted
        if self.quotas is not None:
            self.quotas.check_resubmit(chosen, only_failed)
        if backend is not None:  # checked by its driver, as resubmit(backend=...) checks it embedded
            backend = checked_backend(Backend.from_dict(backend), fqid_str(chosen[0])).to_dict()
        done = await self.transport.resubmit(chosen, only_failed=only_failed, keep_going=keep_going,
                                     backend=backend, from_state=from_state)
        return self._answer(done.acted, fqid)

    async def release(self, targets: Sequence[str] | None = None, retry_args: Sequence[str] | None = None,
                      fqid: str | None = None) -> dict[str, Any]:
        return self._answer((await self.transport.release(self._targets(targets, fqid), retry_args)).acted, fqid)

    async def force_status(self, targets: Sequence[str] | None = None, status: str = "failed", force: bool = False,
                           keep_going: bool = False, fqid: str | None = None) -> dict[str, Any]:
        done = await self.transport.force_status(self._targets(targets, fqid), parse_status(status), force, keep_going)
        return self._answer(done.acted, fqid)

    async def remove(self, targets: Sequence[str] | None = None, keep_going: bool = False,
                     fqid: str | None = None) -> dict[str, Any]:
        done = await self.transport.remove(self._targets(targets, fqid), keep_going)
        return {"acted": done.acted, **({"fqid": fqid, "removed": True} if fqid is not None else {})}

    async def merge(self, targets: Sequence[str] | None = None, fqid: str | None = None) -> dict[str, Any]:
        return self._answer((await self.transport.merge(self._targets(targets, fqid))).acted, fqid)

    async def wait(self, targets: Sequence[str] | None = None, timeout: float | None = None,
                   fqid: str | None = None) -> dict[str, Any]:
        """Return once nothing of the jobs is active, or after ``timeout`` (``timed_out`` says which, and
        ``active`` names the jobs still active then)."""
        chosen = self._targets(targets, fqid)
        active: list[str] = []
        try:
            await self.transport.wait(chosen, timeout)
            timed_out = False
        except WaitTimeout as exc:
            timed_out, active = True, exc.active
        except TimeoutError:
            timed_out = True
        return {**self._answer(0, fqid), "timed_out": timed_out, **({"active": active} if timed_out else {})}

    async def annotate(self, job: int, comment: str | None = None,
                       metadata: dict[str, Any] | None = None) -> dict[str, Any]:
        self._known((int(job),))
        self.transport.annotate(int(job), comment, metadata)
        return {}

    async def refresh(self) -> dict[str, Any]:
        await self.transport.refresh()
        await anyio.lowlevel.checkpoint()
        return {}


#: The methods a client may call (the HTTP API's routes).
METHODS = frozenset({"jobs", "show", "master", "health", "describe", "info", "infos", "backend_id", "subjob_specs",
                     "splitter_spec", "peek", "metrics", "states", "story", "add", "submit", "kill", "resubmit",
                     "release", "force_status", "remove", "merge", "wait", "annotate", "refresh", "owner"})
#: Methods a ``GET`` may call: they change nothing.
READ_ONLY = frozenset({"jobs", "show", "master", "health", "describe", "info", "infos", "backend_id", "peek", "metrics",
                       "states", "story", "splitter_spec", "owner"})

__all__ = ["METHODS", "READ_ONLY", "Control", "JobStatus"]
