"""The control adapter: a client's decoded request, checked, handed to the embedded transport, its reply as JSON.

The service decodes each request at its boundary into its typed request
(:mod:`orchestrator.api.wire`); :meth:`Control.call` checks what a client
may not be trusted with (the jobs it names exist and are its own, a
resubmission within its quota, a new backend's settings), hands the request
to the caller's embedded transport (:meth:`~orchestrator.api.embedded.Embedded.handle`,
which every operation goes through, in process or not), and answers with
its reply. So an operation has one implementation, and the API behaves the
same through a service as embedded: the remote transport
(:mod:`orchestrator.api.remote`) sends the same requests over the socket.

Job ids travel as fqid strings (``"3"``, ``"3.1"``); statuses as their names;
a master's subjob statuses as one string of digits (their codes), so that a
client can mirror a master of a million subjobs in one answer. An operation
names its jobs with ``targets`` (a list), or one with ``fqid``; naming one, it
answers with that job's summary (as ``jobs`` lists it) and ``acted``.

``jobs``, ``show``, ``master`` and ``health`` are views answered here: the
records the CLI prints (:mod:`orchestrator.api.views`), for clients that
speak HTTP alone (the status page, ``curl``).

Each request is answered by the view of its caller (:meth:`Control.as_caller`):
its transport sees that user's jobs only (every job for an admin), so a job
of another user is left out of listings, and naming one is refused with a
:class:`~orchestrator.core.errors.NotOwnerError` that says whose it is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from ..api import views, wire
from ..api.embedded import DIGITS, Embedded
from ..api.owners import Caller
from ..api.registry import JobRegistry
from ..api.validate import checked_backend
from ..api.wire import BadRequest
from ..core.errors import UnknownJobError
from ..core.ids import FQID, fqid_str, parse_fqid
from ..core.model import Backend
from ..core.statuses import JobStatus
from .quotas import Quotas


def _fq(value: Any) -> FQID:
    try:
        return parse_fqid(value)
    except ValueError:
        raise UnknownJobError(f"no job {value}", fqid=str(value)) from None


class Control:
    """See the module docstring."""

    def __init__(self, transport: Embedded, quotas: Quotas | None = None) -> None:
        #: The caller's embedded transport: every request ends there.
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

    async def call(self, request: wire.Request) -> Any:
        """Answer a client's decoded request: a view (:data:`VIEWS`), or the request checked (:data:`CHECKS`),
        handled by the embedded transport, and its reply as the client is answered."""
        view = VIEWS.get(type(request))
        if view is not None:
            return await view(self, request)
        check = CHECKS.get(type(request))
        if check is not None:
            request = check(self, request)
        return self._answer(request, await self.transport.handle(request))

    # ------------------------------------------------------------ checks
    def _known(self, fq: FQID) -> FQID:
        if not self.transport.statuses().exists(fq):
            raise self.registry.missing(fq)
        return fq

    def _targets(self, request: Any) -> Any:
        """An operation's jobs, each known and the caller's, as tuples (:class:`~orchestrator.api.wire.Fqids`)."""
        named = list(request.targets or ()) + ([request.fqid] if request.fqid is not None else [])
        if not named:
            raise BadRequest("name the jobs: targets=[...] or fqid=...", field="targets")
        chosen = [self._known(_fq(t)) for t in named]
        if isinstance(request, wire.SubmitRequest):
            tops = {fq[0] for fq in chosen if len(fq) == 1}
            for job in request.definitions or {}:
                if int(job) not in tops:
                    raise BadRequest(f"a definition for job {job}, which the request does not submit",
                                     fqid=str(job), field=f"definitions.{job}")
        changes: dict[str, Any] = {"targets": wire.Fqids(chosen)}
        if isinstance(request, wire.ResubmitRequest):
            if self.quotas is not None:
                self.quotas.check_resubmit(chosen, request.only_failed)
            if request.backend is not None:  # checked by its driver, as resubmit(backend=...) checks it embedded
                given = Backend.from_dict({"name": request.backend.name, "settings": request.backend.settings})
                backend = checked_backend(given, fqid_str(chosen[0]))
                changes["backend"] = wire.BackendSpec(name=backend.name, settings=backend.to_dict()["settings"])
        return msgspec.structs.replace(request, **changes)

    def _one(self, request: Any) -> Any:
        self._known(_fq(request.fqid))
        return request

    def _job(self, request: Any) -> Any:
        self._known((int(request.job),))
        return request

    def _many(self, request: wire.InfosRequest) -> wire.InfosRequest:
        return msgspec.structs.replace(request, fqids=wire.Fqids([self._known(_fq(f)) for f in request.fqids]))

    def _answer(self, request: wire.Request, reply: Any) -> Any:
        """The reply as the client is answered: with the summary of the one job an operation named (``fqid``)."""
        if isinstance(request, wire.AddRequest):
            return {"id": reply["id"], **views.summary(self.registry.top(int(reply["id"])))}
        if isinstance(request, wire.SubjobSpecsRequest):
            return {str(i): spec for i, spec in reply.items()}
        if not isinstance(request, wire.OPERATIONS) or request.fqid is None:
            return reply
        if isinstance(request, wire.RemoveRequest):
            return {"acted": reply["acted"], "fqid": request.fqid, "removed": True}
        if not self.transport.statuses().exists(_fq(request.fqid)):
            return reply
        return {**views.summary(self.registry.lookup(_fq(request.fqid))), **reply}

    # ------------------------------------------------------------ views
    async def jobs(self, r: wire.JobsRequest) -> list[dict[str, Any]]:
        """Top-level jobs as ``orchestrator jobs`` lists them (the caller's, or every one for an admin)."""
        return views.summaries(list(self.registry.select(status=list(r.status or ()) or None, name=r.name,
                                                         owner=r.owner)))

    async def show(self, r: wire.ShowRequest) -> dict[str, Any]:
        """A job as ``orchestrator show`` shows it."""
        return views.detail(self.registry.lookup(self._known(_fq(r.fqid))), int(r.subjobs))

    async def health(self, r: wire.HealthRequest | None = None) -> dict[str, Any]:
        rt = self.transport.runtime
        return {"ok": True, "role": "active", "pid": os.getpid(), "home": str(self.transport.home),
                "workspace": str(self.transport.workspace), "jobs": len(self.transport.statuses().job_ids()),
                "monitored": sum(b["held"] for b in rt.metrics()["backends"].values()), "time": time.time()}

    async def master(self, r: wire.MasterRequest) -> dict[str, Any]:
        """What a master's page shows: its runs' status codes (one digit each), its failed runs with their
        reasons (the first ``failures``), and when its runs ended, completed or failed (at most ``points``
        times of each, evenly sampled, for the plot)."""
        fq = self._known(_fq(r.fqid))
        job = self.registry.lookup(fq)
        out: dict[str, Any] = {**views.summary(job), "codes": None, "failures": [], "ended": {}}
        sm = self.transport.runtime.sm
        if len(fq) > 1 or not sm.is_master(fq[0]):
            return out
        statuses = sm.statuses(fq[0])
        out["codes"] = statuses.translate(DIGITS).decode()
        failed = [i for i, code in enumerate(statuses) if code == JobStatus.FAILED.code][:int(r.failures)]
        out["failures"] = [[i, reason or "failed"] for i, reason in zip(failed, sm.reasons(fq[0], failed), strict=True)]
        final = sm.final_times(fq[0])
        for status in (JobStatus.COMPLETED, JobStatus.FAILED):
            times = sorted(final[i] for i, code in enumerate(statuses) if code == status.code and final[i])
            step = max(1, len(times) // int(r.points))
            out["ended"][status.value] = {"n": len(times), "times": times[::step]}
        return out


#: Requests answered here, not by the transport: the views of HTTP-only clients.
VIEWS: dict[type[wire.Request], Callable[[Control, Any], Awaitable[Any]]] = {
    wire.JobsRequest: Control.jobs, wire.ShowRequest: Control.show, wire.HealthRequest: Control.health,
    wire.MasterRequest: Control.master,
}
#: What is checked of each request before the transport handles it (the others go as they are).
CHECKS: dict[type[wire.Request], Callable[[Control, Any], Any]] = {
    **{cls: Control._targets for cls in wire.OPERATIONS},
    **{cls: Control._one for cls in (wire.InfoRequest, wire.BackendIdRequest, wire.PeekRequest, wire.StatesRequest,
                                     wire.StoryRequest)},
    **{cls: Control._job for cls in (wire.SplitterSpecRequest, wire.SubjobSpecsRequest, wire.AnnotateRequest)},
    wire.InfosRequest: Control._many,
}

#: The methods a client may call (the HTTP API's routes).
METHODS = frozenset(wire.REQUESTS)
#: Methods a ``GET`` may call: they change nothing.
READ_ONLY = frozenset({"jobs", "show", "master", "health", "describe", "info", "infos", "backend_id", "peek", "metrics",
                       "states", "story", "splitter_spec", "owner"})

__all__ = ["METHODS", "READ_ONLY", "Control"]
