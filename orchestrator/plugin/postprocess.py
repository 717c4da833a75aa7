"""Postprocessors: what runs once on a master after every subjob ended (mergers, checkers, notifiers).

A postprocessor is a plugin of the entry-point group
``orchestrator.postprocessors`` (``orchestrator.mergers`` is read too). It is
part of a job's definition, stored as ``{"plugin": name, "params": {...}}``
and rebuilt by name, so ``params()`` must round-trip. The runtime calls
``run(context)`` in a worker thread (postprocessors read and write files);
what it returns decides: an ``error`` fails the master with that reason, and
``failed_subjobs`` fails completed subjobs a checker found wanting.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..core.statuses import JobStatus


@dataclass(frozen=True, slots=True)
class SubjobOutput:
    index: int
    status: JobStatus
    outputdir: Path
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class PostprocessContext:
    """What a postprocessor sees: the master, where its merged output goes, and its subjobs' outputs."""

    fqid: str
    name: str
    outputdir: Path
    subjobs: Sequence[SubjobOutput]
    #: Subjobs per status name.
    counts: Mapping[str, int] = field(default_factory=dict)
    #: ``[postprocess]`` of the configuration (SMTP settings for a notifier...).
    config: Mapping[str, Any] = field(default_factory=dict)
    log: Any = None
    #: The OS user the master belongs to (``None``: the orchestrator's own user).
    owner: str | None = None


@dataclass(slots=True)
class PostprocessResult:
    error: str | None = None
    failed_subjobs: list[tuple[int, str]] = field(default_factory=list)


class Postprocessor(ABC):
    name: ClassVar[str] = ""

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """Constructor keyword arguments that rebuild this postprocessor."""

    @abstractmethod
    def run(self, context: PostprocessContext) -> PostprocessResult:
        """Do the work; blocking I/O is fine (a worker thread runs it)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, Postprocessor) and other.params() == self.params()

    def __hash__(self) -> int:
        return hash(type(self))


class Merger(Postprocessor):
    """A postprocessor that merges subjobs' outputs: implement ``merge``; a reason string fails the master."""

    @abstractmethod
    def merge(self, outputdir: Path, subjobs: Sequence[tuple[int, JobStatus, Path]]) -> str | None:
        """Merge from ``(index, status, outputdir)`` of each subjob into ``outputdir``."""

    def run(self, context: PostprocessContext) -> PostprocessResult:
        return PostprocessResult(self.merge(context.outputdir, [(s.index, s.status, s.outputdir)
                                                                 for s in context.subjobs]))


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a master ended, as a notification tells it: after its other postprocessors ran."""

    status: str  # completed, failed, killed or held
    counts: Mapping[str, int]
    #: ``(fqid, reason)`` of the first failures, in index order (at most ten).
    failures: Sequence[tuple[str, str]] = ()
    #: Why the postprocessors failed the master, if they did.
    error: str | None = None


class Notification(Postprocessor):
    """A postprocessor that tells someone how a master ended, once per master (never once per subjob).

    The runtime runs notifications after every other postprocessor, with the outcome those left (a checker's
    failures counted), and only for an ending named in ``on``; a master that becomes ``held`` is told at
    once. A notification that cannot be delivered is logged: it never fails the job.
    """

    on: tuple[str, ...] = ("failed", "held", "completed")

    @abstractmethod
    def send(self, context: PostprocessContext, outcome: Outcome) -> None:
        """Deliver the message (blocking I/O is fine: a worker thread runs it); raise ``OSError`` if it failed."""

    def run(self, context: PostprocessContext) -> PostprocessResult:
        return PostprocessResult()

