"""DataGrid's job partitioning: ``StepSplitter`` makes a master's subjobs from its steps.

A splitter plugin like any other (entry point ``steps``), built on the
partition arithmetic of :mod:`orchestrator.core.splitters` and on the
worker's own :class:`~orchestrator.checkpoint.Steps` (a range of a million
steps costs two integers).
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

from ..checkpoint import Steps
from ..core.errors import JobError
from ..core.splitters import Master, Splitter, Unsubmitted, as_master, count_param, partition_contiguous


class StepSplitter(Splitter):
    """Partition the master's ``steps`` into ``m`` contiguous sub-lists (DataGrid job partitioning).

    With ``step_weights`` the parts minimise the largest total weight
    (:func:`partition_contiguous`); without, they differ in length by one at
    most. ``m`` defaults to the backend's free slots (its ``max_running``
    less the runs under way). Each subjob's steps become its initial state.
    """

    name = "steps"

    def __init__(self, m: int | None = None) -> None:
        self.m = m

    def params(self) -> dict[str, Any]:
        return {"m": self.m}

    def parts(self, master: Master | Unsubmitted) -> list[tuple[int, int]]:
        """``(start, stop)`` index ranges of the steps, one per subjob."""
        master = as_master(master)
        where = master.fqid
        spec = master.spec.get("steps")
        if spec is None:
            raise JobError("StepSplitter needs steps (Job(steps=...)), and the job has none", fqid=where,
                           field="steps")
        n = len(Steps(spec))
        m = count_param(self.m if self.m is not None else master.free_slots, "m", where)
        if n == 0:
            raise JobError("the job has no steps to partition", fqid=where, field="steps")
        m = min(m, n)
        weights = master.spec.get("step_weights")
        if weights is None:
            size, extra = divmod(n, m)
            bounds = list(accumulate((size + (1 if k < extra else 0) for k in range(m)), initial=0))
            return list(zip(bounds, bounds[1:], strict=False))
        starts = partition_contiguous(weights, m)
        return list(zip(starts, [*starts[1:], n], strict=True))

    def split(self, master: Master | Unsubmitted) -> list[dict[str, Any]]:
        master = as_master(master)
        steps = Steps(master.spec.get("steps"))
        return [{"steps": steps[start:stop].spec(), "step_weights": None} for start, stop in self.parts(master)]
