"""The transport: what the one user API needs of an orchestrator, whichever way it is reached.

As httpx has one client over pluggable transports, ``Orchestrator``,
``Job`` and slices are written once over this protocol, with two
implementations: :class:`~.embedded.Embedded` (the runtime, in this
process) and :class:`~.remote.Remote` (a running service, over its socket).

The protocol is four calls, after httpx's ``handle_async_request``: the API
(``Orchestrator``, ``Job``, slices, the registry) builds the service's own
typed requests (:mod:`.wire`) and hands them to ``handle`` (operations,
reads that may wait) or ``read`` (the few details offered as attributes);
``statuses()`` is what is known now of every job's status, read without
asking (``job.status`` is an attribute); ``events()`` the stream. So the
API is written once; the embedded transport dispatches each request type to
its handler through one table; the remote one encodes the request, sends
it, and returns the service's JSON reply; the service's control adapter
decodes a client's request, checks it and hands it to the embedded
transport of that client. Operations raise ``JobError`` as the state
machine answered.

Why not one method per operation (there were 28, written three times): each
new operation then meant a method here, in both transports and in the
control adapter; now it is a request type and one handler. Why four and not
one: ``read`` is ``handle`` without ``await``, for what the API must answer
synchronously (``job.info``; remote, a short blocking request, as embedded
reads SQLite); ``statuses`` is not a request at all, since ``job.status``
of a million subjobs must cost an array read, not a round trip (remote, the
mirror answers); and ``events`` is a stream, not a reply.

A request made in this process names its jobs as
:class:`~.wire.Fqids`: the tuples themselves, seen as fqid strings only if
someone reads them (the remote transport, encoding), so a slice of a
million subjobs costs the embedded transport no string at all.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..core.errors import WaitTimeout
from ..core.ids import FQID, fqid_str
from ..core.statuses import JobStatus
from . import wire
from .owners import Caller


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A top-level job as stored: its name, its definition (``spec``), when it was added, whose it is."""

    id: int
    name: str
    spec: dict[str, Any]
    added: float = 0.0
    owner: str = ""


@dataclass(frozen=True, slots=True)
class Done:
    """What a request did: how many runs it acted on (0: nothing to do)."""

    acted: int = 0
    details: dict[str, Any] = field(default_factory=dict)


class Statuses(Protocol):
    """What is known now of the caller's jobs, read synchronously (``job.status`` is an attribute).

    A live view, not a copy: the embedded transport's reads the state
    machine; the remote one's is the mirror the event stream keeps current.
    Every ``fq`` is a fully qualified id as a tuple.
    """

    def job_ids(self) -> list[int]: ...
    def owner(self, job: int) -> str | None:
        """The owner of any top-level job of the home, the caller's or not (``None``: no such job)."""
    def record(self, job: int) -> JobRecord: ...
    def exists(self, fq: FQID) -> bool: ...
    def status(self, fq: FQID) -> JobStatus: ...
    def n_subjobs(self, job: int) -> int: ...
    def counts(self, job: int) -> dict[JobStatus, int]: ...
    def indexes(self, job: int, statuses: Sequence[JobStatus]) -> list[int]: ...
    def active(self, fq: FQID) -> bool: ...


class Transport(Protocol):
    """See the module docstring: four calls, as httpx's transports have one.

    A request is the typed request of :mod:`.wire`, the one the service decodes
    at its boundary (its jobs as :class:`~.wire.Fqids` when made here); a
    reply is the JSON value the service answers with for it (before the
    service adds a job's summary to an operation that named one ``fqid``):
    ``{"acted": n}`` for an operation, ``{"id": n}`` for an add, ``{"text":
    ...}`` for a peek, ``{"acted": 0, "timed_out": ..., "active": [...]}``
    for a wait, ``{"owner": ...}``, the ``info`` dict, the list of states...

    Requests and reads see the ``caller``'s jobs only (every job for an
    admin): ``job_ids`` leaves the others' out, ``exists`` is false for them,
    and an operation on one raises
    :class:`~orchestrator.core.errors.NotOwnerError`.
    """

    home: Path
    #: Who this transport acts as (:mod:`.owners`).
    caller: Caller
    #: The root of the job directories (``<home>/workspace``, or in a shared repository's shared directory).
    workspace: Path

    async def handle(self, request: wire.Request) -> Any:
        """Every operation, and every read that may wait (a peek, the states, a story, the metrics): its reply,
        or the error the state machine or the service answered with."""
    def read(self, request: wire.Request) -> Any:
        """The few details read synchronously because the API offers them as attributes (``job.info``,
        ``job.backend_id``, a subjob's definition, setting ``job.comment``): embedded, from the state machine
        and the repository; remote, a short blocking request on the local socket, as SQLite is read."""
    def statuses(self) -> Statuses:
        """The statuses as known now (:class:`Statuses`): what the API reads without asking anyone."""
    def events(self) -> AsyncIterator[Any]:
        """Every event and change of the caller's jobs, in order, as the state machine made them."""


def done(reply: dict[str, Any]) -> Done:
    """An operation's reply as the :class:`Done` the API answers with."""
    return Done(int(reply.get("acted", 0)))


def waited(reply: dict[str, Any], targets: Sequence[FQID], timeout: float | None) -> None:
    """A wait's reply: nothing, or the ``WaitTimeout`` naming the jobs still active."""
    if reply.get("timed_out"):
        active = reply.get("active") or [fqid_str(fq) for fq in targets]
        raise WaitTimeout([str(a) for a in active], timeout)


class Jobs(Protocol):
    """What a bound job needs of ``orch.jobs``: the transport, and its jobs by id (``JobRegistry`` is one)."""

    transport: Transport

    def get(self, key: Any, default: Any = None) -> Any: ...
    async def add(self, job: Any) -> Any: ...
    def forget(self, job: Any) -> None: ...
