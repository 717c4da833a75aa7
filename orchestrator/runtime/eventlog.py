"""The log as an observer of the bus: one line per request and per batch of status changes.

A hook of :class:`~.bus.Bus` (called with every event and the step it made,
inside the event's stimulus id): each user request gives one ``request`` line,
and each change in the step one ``status`` line, at INFO (what the service
logs). A change is a batch: the runs of one job that moved from one status to
another in one step (a chunk of a submission, a tick's endings), so a master
of a million subjobs makes a line per batch, never a line per subjob. Every
line carries ``fqid`` (the run's own ``"3.1"`` when the batch is one run, else
the job's ``"3"``, with ``subjobs`` naming the indexes compactly:
``"0-99999"``, ``"4,7,10-12"``, cut after :data:`SEGMENTS` pieces with the
count in ``runs``), and ``stimulus_id`` (bound by the bus).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..core.events import Event, Request
from ..core.ids import FQID, as_range, fqid_str
from ..core.step import Step

#: Pieces of a batch's index list written out before the rest is only counted.
SEGMENTS = 20


def compact(indexes: Sequence[int]) -> str:
    """``indexes`` (ascending as a rule) as ``"a-b,c,d-e"``, at most :data:`SEGMENTS` pieces then ``",..."``."""
    if not len(indexes):
        return ""
    whole = as_range(indexes)
    if whole is not None:
        return str(whole.start) if len(whole) == 1 else f"{whole.start}-{whole.stop - 1}"
    pieces: list[str] = []
    start = prev = indexes[0]
    for i in indexes[1:]:
        if i == prev + 1:
            prev = i
            continue
        pieces.append(str(start) if start == prev else f"{start}-{prev}")
        if len(pieces) >= SEGMENTS:
            return ",".join(pieces) + ",..."
        start = prev = i
    pieces.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(pieces)


def targets_text(targets: Sequence[FQID]) -> str:
    """A request's targets, the first :data:`SEGMENTS` of them, then how many in all."""
    shown = ",".join(fqid_str(t) for t in targets[:SEGMENTS])
    return shown if len(targets) <= SEGMENTS else f"{shown},... ({len(targets)} in all)"


class EventLog:
    """The bus hook; ``log`` is a structlog logger (the service's)."""

    def __init__(self, log: Any) -> None:
        self.log = log

    def __call__(self, event: Event, step: Step) -> None:
        log = self.log
        if isinstance(event, Request):
            log.info("request", type=type(event).__name__, fqid=targets_text(event.targets),
                     keep_going=event.keep_going)
        for change in step.changes:
            fields: dict[str, Any] = {"old": change.old.value, "new": change.new.value}
            if change.forced:
                fields["forced"] = True
            indexes = change.indexes
            if indexes is None:
                log.info("status", fqid=str(change.job), **fields)
            elif len(indexes) == 1:
                log.info("status", fqid=f"{change.job}.{indexes[0]}", **fields)
            else:
                log.info("status", fqid=str(change.job), subjobs=compact(indexes), runs=len(indexes), **fields)


__all__ = ["EventLog", "SEGMENTS", "compact", "targets_text"]
