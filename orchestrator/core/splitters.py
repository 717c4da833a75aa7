"""Splitters: a master's subjobs, as what each changes in the master's definition.

A splitter is pure: ``split(master)`` reads the master's definition (the
stored form: ``application``, ``inputfiles``, ``backend``, ``steps``...)
and returns one *delta* per subjob, in index order: a mapping from a dotted
path (``"application.args"``, ``"backend.mem"``, ``"inputfiles"``,
``"name"``) to the subjob's value there. A subjob is its master's
definition with its delta applied, so a million subjobs are a million small
dicts, never a million job objects, and the repository keeps each delta as
it came. Any problem raises :class:`JobError` naming the field, so
``submit()`` rolls back with nothing left behind. Splitters are plugins of
the entry-point group ``orchestrator.splitters``.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, ClassVar, Protocol

from .errors import JobError

#: Top-level fields a delta may set; ``application.*`` and ``backend.*`` set one field of those.
SETTABLE = frozenset({"name", "inputfiles", "outputfiles", "steps", "step_weights", "mode"})
APPLICATION_FIELDS = frozenset({"exe", "args", "env"})


@dataclass(frozen=True, slots=True)
class Master:
    """What a splitter sees of the master: its id (for messages), its definition, its backend's free slots."""

    fqid: str
    spec: Mapping[str, Any]
    #: Runs the master's backend could start now (``StepSplitter()``'s default m).
    free_slots: int = 1
    name: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


class Unsubmitted(Protocol):
    """A job not submitted yet, as a built-in splitter also takes it (``ArgSplitter(...).split(job)``)."""

    def spec(self) -> Mapping[str, Any]: ...


#: A splitter's definition left out where only its name is needed (its arguments can be a million values):
#: ``{"plugin": name, DEFERRED: True}``; the full one is read from where it is stored when it is used.
DEFERRED = "deferred"


def is_deferred(splitter: Any) -> bool:
    return isinstance(splitter, dict) and bool(splitter.get(DEFERRED))


def deferred(splitter: Mapping[str, Any]) -> dict[str, Any]:
    """A splitter's stored definition with its parameters left out (:data:`DEFERRED`)."""
    return {"plugin": splitter.get("plugin"), DEFERRED: True}


def as_master(master: Master | Unsubmitted) -> Master:
    """What a splitter sees, from a :class:`Master` or from an unsubmitted job (``split(job)`` works too)."""
    if isinstance(master, Master):
        return master
    spec = master.spec() if callable(getattr(master, "spec", None)) else None
    if not isinstance(spec, Mapping):
        raise TypeError(f"a splitter splits a job, not {master!r}")
    return Master(str(getattr(master, "fqid_or_new", "(new job)")), spec, 1, str(getattr(master, "name", "")))


def count_param(value: Any, name: str, fqid: str) -> int:
    """A splitter's count parameter ``name`` (``files_per_job``, ``m``...): an integer >= 1, else the error
    every splitter gives for it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise JobError(f"{name} must be an integer >= 1, not {value!r}", fqid=fqid, field=f"splitter.{name}")
    return value


class Splitter(ABC):
    """Base of splitters; ``name`` is the entry-point name, ``params()`` round-trips.

    ``split`` receives a :class:`Master`; a built-in splitter also takes a job
    that is not submitted yet (``ArgSplitter(...).split(job)``), to see its deltas.
    """

    name: ClassVar[str] = ""

    @abstractmethod
    def split(self, master: Master) -> Sequence[Mapping[str, Any]]:
        """One delta per subjob, in index order (at least one)."""

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """Constructor keyword arguments that rebuild this splitter."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Splitter) and type(other) is type(self) and other.params() == self.params()

    def __hash__(self) -> int:
        return hash(type(self))


def check_path(path: str, fqid: str) -> None:
    """A delta's path must name a field a subjob may have of its own."""
    head, _, rest = path.partition(".")
    if (head == "application" and rest in APPLICATION_FIELDS) or (head == "backend" and rest and "." not in rest):
        return
    if path in SETTABLE:
        return
    raise JobError(f"has no settable attribute {path!r}", fqid=fqid, field=path)


def apply_delta(spec: Mapping[str, Any], delta: Mapping[str, Any]) -> dict[str, Any]:
    """The master's definition with one subjob's delta applied (the master's is left as it is)."""
    out = dict(spec)
    for path, value in delta.items():
        head, _, rest = path.partition(".")
        if head == "application":
            app = dict(out.get("application") or {})
            app[rest] = copy.deepcopy(value)
            out["application"] = app
        elif head == "backend":
            backend = dict(out["backend"])
            settings = dict(backend.get("settings", {}))
            settings[rest] = copy.deepcopy(value)
            backend["settings"] = settings
            out["backend"] = backend
        else:
            out[head] = copy.deepcopy(value)
    return out


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
        for path in cols:
            check_path(path, fqid)
        return cols

    def split(self, master: Master | Unsubmitted) -> list[dict[str, Any]]:
        master = as_master(master)
        cols = self.columns(master.fqid)
        if len(cols) == 1:
            (path, values), = cols.items()
            return [{path: v} for v in values]
        names = list(cols)
        return [dict(zip(names, row, strict=True)) for row in zip(*cols.values(), strict=True)]


class ArgSplitter(Splitter):
    """One subjob per argument list: ``ArgSplitter([["a"], ["b"]])``."""

    name = "args"

    def __init__(self, args: Sequence[Sequence[Any]]) -> None:
        self.args = [list(a) if isinstance(a, (list, tuple)) else a for a in args]

    def params(self) -> dict[str, Any]:
        return {"args": self.args}

    def split(self, master: Master | Unsubmitted) -> list[dict[str, Any]]:
        master = as_master(master)
        if not self.args:
            raise JobError("ArgSplitter has no argument lists: it would make no subjob", fqid=master.fqid,
                           field="splitter.args")
        for i, a in enumerate(self.args):
            if not isinstance(a, list):
                raise JobError(f"argument set {i} is {a!r}, not a list", fqid=master.fqid, field="splitter.args")
        return [{"application.args": a} for a in self.args]


class FileSplitter(Splitter):
    """Split ``inputfiles`` into subjobs of ``files_per_job`` files each."""

    name = "files"

    def __init__(self, files_per_job: int = 1) -> None:
        self.files_per_job = files_per_job

    def params(self) -> dict[str, Any]:
        return {"files_per_job": self.files_per_job}

    def split(self, master: Master | Unsubmitted) -> list[dict[str, Any]]:
        master = as_master(master)
        k = count_param(self.files_per_job, "files_per_job", master.fqid)
        files = list(master.spec.get("inputfiles") or [])
        if not files:
            raise JobError("FileSplitter needs input files, and the job has none", fqid=master.fqid,
                           field="inputfiles")
        return [{"inputfiles": files[start:start + k]} for start in range(0, len(files), k)]


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


__all__ = ["ArgSplitter", "FileSplitter", "GenericSplitter", "Master", "Splitter", "apply_delta",
           "check_path", "count_param", "partition_contiguous"]
