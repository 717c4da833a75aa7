"""The transport: what the one user API needs of an orchestrator, whichever way it is reached.

As httpx has one client over pluggable transports, ``Orchestrator``,
``Job`` and slices are written once over this protocol, with two
implementations: :class:`~.embedded.Embedded` (the runtime, in this
process) and :class:`~.remote.Remote` (a running service, over its socket).

Reads are synchronous (``job.status`` is an attribute): the embedded
transport answers from the state machine and the repository; the remote one
from a mirror the service's event stream keeps current, and with a short
request for details. Operations are ``async`` and raise ``JobError`` as the
state machine answered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..core.ids import FQID
from ..core.statuses import JobStatus
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


class Transport(Protocol):
    """See the module docstring. Every ``fq`` is a fully qualified id as a tuple.

    Reads and operations see the ``caller``'s jobs only (every job for an admin): ``job_ids`` leaves the
    others' out, ``exists`` is false for them, and an operation on one raises
    :class:`~orchestrator.core.errors.NotOwnerError`.
    """

    home: Path
    #: Who this transport acts as (:mod:`.owners`).
    caller: Caller
    #: The root of the job directories (``<home>/workspace``, or in a shared repository's shared directory).
    workspace: Path

    # ------------------------------------------------------------ reads
    def job_ids(self) -> list[int]: ...
    def owner_of(self, job: int) -> str | None:
        """The owner of any top-level job of the home, the caller's or not (``None``: no such job)."""
    def record(self, job: int) -> JobRecord: ...
    def exists(self, fq: FQID) -> bool: ...
    def status(self, fq: FQID) -> JobStatus: ...
    def n_subjobs(self, job: int) -> int: ...
    def counts(self, job: int) -> dict[JobStatus, int]: ...
    def indexes(self, job: int, statuses: Sequence[JobStatus]) -> list[int]: ...
    def active(self, fq: FQID) -> bool: ...
    def info(self, fq: FQID) -> dict[str, Any]: ...
    def infos(self, fqs: Sequence[FQID]) -> list[dict[str, Any]]:
        """``info`` of many jobs in one call (a listing of every top-level job)."""
    def backend_id(self, fq: FQID) -> str | None: ...
    def splitter_spec(self, job: int) -> dict[str, Any] | None:
        """The stored definition of a master's splitter (a listing may leave it out)."""
    def subjob_specs(self, job: int, indexes: Sequence[int]) -> dict[int, dict[str, Any]]: ...

    # ------------------------------------------------------------ operations
    async def add(self, name: str, spec: dict[str, Any]) -> int: ...
    async def submit(self, targets: Sequence[FQID], keep_going: bool,
                     definitions: dict[int, tuple[str, dict[str, Any]]] | None = None) -> Done:
        """Submit; ``definitions``: new jobs' definitions as they are now (name, spec), by job id."""
    async def kill(self, targets: Sequence[FQID], keep_going: bool) -> Done: ...
    async def resubmit(self, targets: Sequence[FQID], *, only_failed: bool, keep_going: bool,
                       backend: dict[str, Any] | None, from_state: str | None) -> Done: ...
    async def release(self, targets: Sequence[FQID], retry_args: Sequence[str] | None) -> Done: ...
    async def force_status(self, targets: Sequence[FQID], status: JobStatus, force: bool,
                           keep_going: bool) -> Done: ...
    async def remove(self, targets: Sequence[FQID], keep_going: bool) -> Done: ...
    async def merge(self, targets: Sequence[FQID]) -> Done:
        """Run ended masters' postprocessors again over every subjob."""
    async def wait(self, targets: Sequence[FQID], timeout: float | None) -> None: ...
    async def peek(self, fq: FQID, name: str, tail: int | None) -> str: ...
    async def states(self, fq: FQID) -> list[dict[str, Any]]:
        """The checkpoint states kept for a job, oldest first (``job``, ``seq``, ``time``, ``final``, ``data``)."""
    async def story(self, fq: FQID) -> list[dict[str, Any]]:
        """The recent events, changes, refusals and instructions that touched a job, oldest first
        (:mod:`orchestrator.runtime.story`): what happened to it, and why, by stimulus id."""
    def annotate(self, job: int, comment: str | None, metadata: dict[str, Any] | None) -> None: ...
    def events(self) -> AsyncIterator[Any]: ...
    async def refresh(self) -> None: ...
    async def metrics(self) -> dict[str, Any]: ...


class Jobs(Protocol):
    """What a bound job needs of ``orch.jobs``: the transport, and its jobs by id (``JobRegistry`` is one)."""

    transport: Transport

    def get(self, key: Any, default: Any = None) -> Any: ...
    async def add(self, job: Any) -> Any: ...
    def forget(self, job: Any) -> None: ...
