"""What handling one event produced: the changes applied, the refusals, the instructions.

A :class:`Step` is the state machine's whole answer to an event; the
runtime persists its changes, carries out its instructions in order, and
hands both to observers. Changes are grouped (one per job, old and new
status), so a million subjobs moving together are one change, not a million.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from .events import StatusChanged
from .ids import FQID, Runs, fqid_str
from .instructions import Instruction
from .statuses import JobStatus

AnyInstruction = TypeVar("AnyInstruction", bound=Instruction)


@dataclass(frozen=True, slots=True)
class Change:
    """Runs ``indexes`` of job ``job`` (``None``: the job itself) moved from ``old`` to ``new``."""

    job: int
    indexes: Sequence[int] | None
    old: JobStatus
    new: JobStatus
    time: float
    stimulus_id: str
    #: A user's ``force_status``: outside the transition table, on record as forced.
    forced: bool = False

    @property
    def runs(self) -> Runs:
        return Runs(self.job, self.indexes)

    def __len__(self) -> int:
        return 1 if self.indexes is None else len(self.indexes)

    def fqids(self) -> Iterator[FQID]:
        return iter(self.runs)

    def as_event(self) -> StatusChanged:
        return StatusChanged(stimulus_id=self.stimulus_id, time=self.time, changed=self.runs, old=self.old,
                             new=self.new, forced=self.forced)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A move the rules forbid (a backend's report, a user's request): recorded, never applied."""

    fqid: FQID
    reason: str
    stimulus_id: str
    old: JobStatus | None = None
    new: JobStatus | None = None

    def __str__(self) -> str:
        return f"job {fqid_str(self.fqid)}: {self.reason}"


@dataclass(slots=True)
class Step:
    """The answer to one event."""

    stimulus_id: str
    changes: list[Change] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    instructions: list[Instruction] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.changes or self.refusals or self.instructions)

    def of(self, kind: type[AnyInstruction]) -> list[AnyInstruction]:
        """The instructions of one kind, in order (for tests and the runtime's dispatch)."""
        return [i for i in self.instructions if isinstance(i, kind)]
