"""Splitters: make a master's subjobs from the master, before anything is stored.

A splitter is pure: ``split(master)`` returns new, detached ``Job``
templates and touches no disk. Any problem (incompatible input, bad
values, mismatched lengths) raises :class:`JobError` naming the field, so
``submit()`` can roll back with nothing left behind. Splitters are plugins
of the entry-point group ``orchestrator.splitters``.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any, ClassVar

from .errors import JobError

if TYPE_CHECKING:
    from .job import Job


class Splitter(ABC):
    """Base of splitters; ``name`` is the entry-point name, ``params()`` round-trips."""

    name: ClassVar[str] = ""

    @abstractmethod
    def split(self, master: Job) -> list[Job]:
        """Subjob templates in index order (at least one)."""

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """Constructor keyword arguments that rebuild this splitter."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Splitter) and type(other) is type(self) and other.params() == self.params()


def set_path(job: Job, path: str, value: Any) -> None:
    """Set a dotted attribute such as ``application.args`` or ``backend.mem`` on a subjob."""
    parts = path.split(".")
    target: Any = job
    for part in parts[:-1]:
        if part.startswith("_") or not hasattr(target, part):
            raise JobError(f"has no attribute {path!r}", fqid=job.fqid_or_new, field=path)
        target = getattr(target, part)
    last = parts[-1]
    from .model import Backend

    if isinstance(target, Backend):
        target.settings[last] = copy.deepcopy(value)
        return
    if last.startswith("_") or last in ("id", "parent", "subjobs", "status") or not hasattr(target, last):
        raise JobError(f"has no settable attribute {path!r}", fqid=job.fqid_or_new, field=path)
    setattr(target, last, copy.deepcopy(value))


class GenericSplitter(Splitter):
    """One subjob per value: ``GenericSplitter(attribute="application.args", values=[...])``.

    ``multi_attrs={"application.args": [...], "backend.mem": [...]}`` zips
    several attributes; their lists must have the same length.
    """

    name = "generic"

    def __init__(self, attribute: str | None = None, values: Sequence[Any] | None = None,
                 multi_attrs: dict[str, Sequence[Any]] | None = None) -> None:
        self.attribute = attribute
        self.values = list(values) if values is not None else None
        self.multi_attrs = {k: list(v) for k, v in (multi_attrs or {}).items()}

    def params(self) -> dict[str, Any]:
        return {"attribute": self.attribute, "values": self.values, "multi_attrs": self.multi_attrs}

    def columns(self, fqid: str) -> dict[str, list[Any]]:
        cols = dict(self.multi_attrs)
        if self.attribute is not None:
            if self.values is None:
                raise JobError("GenericSplitter has an attribute but no values", fqid=fqid, field="splitter.values")
            cols[self.attribute] = self.values
        elif self.values is not None:
            raise JobError("GenericSplitter has values but no attribute", fqid=fqid, field="splitter.attribute")
        if not cols:
            raise JobError("GenericSplitter needs attribute and values, or multi_attrs", fqid=fqid,
                           field="splitter")
        lengths = {k: len(v) for k, v in cols.items()}
        if len(set(lengths.values())) != 1:
            raise JobError(f"GenericSplitter's value lists differ in length: {lengths}", fqid=fqid,
                           field="splitter.multi_attrs")
        if not next(iter(lengths.values())):
            raise JobError("GenericSplitter has no values: it would make no subjob", fqid=fqid,
                           field="splitter.values")
        return cols

    def split(self, master: Job) -> list[Job]:
        cols = self.columns(master.fqid_or_new)
        n = len(next(iter(cols.values())))
        subjobs = []
        for i in range(n):
            sub = master.template()
            for path, values in cols.items():
                set_path(sub, path, values[i])
            subjobs.append(sub)
        return subjobs


class ArgSplitter(Splitter):
    """One subjob per argument list: ``ArgSplitter([["a"], ["b"]])``."""

    name = "args"

    def __init__(self, args: Sequence[Sequence[Any]]) -> None:
        self.args = [list(a) if isinstance(a, (list, tuple)) else a for a in args]

    def params(self) -> dict[str, Any]:
        return {"args": self.args}

    def split(self, master: Job) -> list[Job]:
        if not self.args:
            raise JobError("ArgSplitter has no argument lists: it would make no subjob", fqid=master.fqid_or_new,
                           field="splitter.args")
        for i, a in enumerate(self.args):
            if not isinstance(a, list):
                raise JobError(f"argument set {i} is {a!r}, not a list", fqid=master.fqid_or_new,
                               field="splitter.args")
        return GenericSplitter("application.args", self.args).split(master)


class FileSplitter(Splitter):
    """Split ``inputfiles`` into subjobs of ``files_per_job`` files each."""

    name = "files"

    def __init__(self, files_per_job: int = 1) -> None:
        self.files_per_job = files_per_job

    def params(self) -> dict[str, Any]:
        return {"files_per_job": self.files_per_job}

    def split(self, master: Job) -> list[Job]:
        k = self.files_per_job
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise JobError(f"files_per_job must be an integer >= 1, not {k!r}", fqid=master.fqid_or_new,
                           field="splitter.files_per_job")
        files = list(master.inputfiles)
        if not files:
            raise JobError("FileSplitter needs input files, and the job has none", fqid=master.fqid_or_new,
                           field="inputfiles")
        subjobs = []
        for start in range(0, len(files), k):
            sub = master.template()
            sub.inputfiles = files[start:start + k]
            subjobs.append(sub)
        return subjobs


def integer_weights(weights: Sequence[float]) -> list[int]:
    """Integers exactly proportional to ``weights``, so that partitioning compares sums without rounding.

    A float is a binary fraction ``n / 2**k``: scaling every weight by the
    largest denominator gives exact integers (Python's are unbounded).
    """
    if all(isinstance(w, int) for w in weights):
        return [int(w) for w in weights]
    ratios = [float(w).as_integer_ratio() for w in weights]
    scale = max(d for _, d in ratios)
    return [n * (scale // d) for n, d in ratios]


def partition_contiguous(weights: Sequence[float], m: int) -> list[int]:
    """Start indexes of ``min(m, n)`` non-empty contiguous parts minimising the largest part's total weight.

    Exact: a binary search on the answer (an integer, see
    :func:`integer_weights`), each candidate checked by the greedy that fills
    every part as far as the candidate allows (optimal for feasibility); the
    greedy stops early enough to leave one step for each remaining part, so
    there are exactly ``min(m, n)`` parts. A check costs ``O(m log n)`` with a
    binary search on prefix sums, so 100,000 steps take milliseconds.
    """
    n = len(weights)
    if n == 0 or m < 1:
        return []
    m = min(m, n)
    w = integer_weights(weights)
    if min(w) < 0:
        raise ValueError("step weights must not be negative")
    prefix = list(accumulate(w, initial=0))

    def starts_within(limit: int) -> list[int] | None:
        starts: list[int] = []
        i = 0
        for k in range(m):
            starts.append(i)
            j = bisect_right(prefix, prefix[i] + limit) - 1
            i = min(j, n - (m - k - 1))
        return starts if i >= n else None

    lo, hi = max(w), prefix[-1]
    while lo < hi:
        mid = (lo + hi) // 2
        if starts_within(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    starts = starts_within(lo)
    assert starts is not None
    return starts


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

    def parts(self, master: Job) -> list[tuple[int, int]]:
        """``(start, stop)`` index ranges of the steps, one per subjob."""
        from .checkpoint import Steps

        where = master.fqid_or_new
        if master.steps is None:
            raise JobError("StepSplitter needs steps (Job(steps=...)), and the job has none", fqid=where,
                           field="steps")
        n = len(Steps(master.steps))
        m = self.m
        if m is None:
            if master._engine is None:
                raise JobError("StepSplitter() without m needs a registered job (to ask its backend)", fqid=where,
                               field="splitter.m")
            m = master.engine.partitions.free_slots(master.backend)
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise JobError(f"m must be an integer >= 1, not {m!r}", fqid=where, field="splitter.m")
        if n == 0:
            raise JobError("the job has no steps to partition", fqid=where, field="steps")
        m = min(m, n)
        if master.step_weights is None:
            size, extra = divmod(n, m)
            bounds = list(accumulate((size + (1 if k < extra else 0) for k in range(m)), initial=0))
            return list(zip(bounds, bounds[1:], strict=False))
        starts = partition_contiguous(master.step_weights, m)
        return list(zip(starts, [*starts[1:], n], strict=True))

    def split(self, master: Job) -> list[Job]:
        from .checkpoint import Steps

        steps = Steps(master.steps)
        subjobs = []
        for start, stop in self.parts(master):
            sub = master.template()
            sub.steps = steps[start:stop].spec()
            sub.step_weights = None
            subjobs.append(sub)
        return subjobs
