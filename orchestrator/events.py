"""Typed, immutable events; each carries a batch of job ids (bulk-first).

Requests (``Submit``, ``Kill``, ``Resubmit``, ``Release``) describe what the
API asks of the backends; reports (``Submitted``, ``SubmitFailed``,
``StatusReport``) come back from drivers and feed the state machine;
``StatusChanged`` goes out to whoever listens.
"""

from __future__ import annotations

from dataclasses import dataclass

from .drivers import StatusUpdate
from .ids import FQID
from .status import JobStatus


@dataclass(frozen=True, slots=True)
class Event:
    ids: tuple[FQID, ...]


@dataclass(frozen=True, slots=True)
class Submit(Event):
    keep_going: bool = False


@dataclass(frozen=True, slots=True)
class Kill(Event):
    keep_going: bool = False


@dataclass(frozen=True, slots=True)
class Resubmit(Event):
    keep_going: bool = False


@dataclass(frozen=True, slots=True)
class Release(Event):
    retry_args: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Submitted(Event):
    backend_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SubmitFailed(Event):
    reasons: tuple[str, ...] = ()
    #: ``new`` under emulated bulk (left unsubmitted), ``failed`` under native bulk.
    to: JobStatus = JobStatus.NEW


@dataclass(frozen=True, slots=True)
class StatusReport(Event):
    backend: str = ""
    updates: tuple[StatusUpdate, ...] = ()


@dataclass(frozen=True, slots=True)
class StatusChanged(Event):
    old: tuple[JobStatus, ...] = ()
    new: tuple[JobStatus, ...] = ()
    time: float = 0.0
