"""Per-run state in compact arrays: what a million subjobs cost is a few dozen bytes each.

A :class:`RunTable` holds the runs of one top-level job: a master's subjobs,
or the single run of a job without subjobs. Everything every run has (its
status, its attempt counter, the times it entered the active statuses) is
an array slot; what only some runs have (a reason, a failure history, retry
counters and arguments, a checkpoint) lives in a sparse ``extras`` dict, so
a run that went through cleanly costs no Python object at all.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any

from .statuses import ALL_STATUSES, FINAL, JobStatus

#: Statuses whose latest entry time every run keeps (an array each); the final one is under "final".
TIMED = ("submitting", "submitted", "running")
#: Statuses whose entry time only the runs that reached them keep (in their extras).
SPARSE_TIMED = frozenset({JobStatus.COMPLETING, JobStatus.HELD, JobStatus.FAILED, JobStatus.KILLED})
#: Failure-history entries kept per run, newest last.
HISTORY_KEPT = 100
#: Refused backend reports kept per run, for the record.
REFUSED_KEPT = 20


@dataclass(slots=True)
class RunRecord:
    """What the core records of a run beyond its status and times: one group of fields, kept per run
    (:class:`RunExtra`) and shown per job (:class:`~orchestrator.core.model.JobInfo`)."""

    reason: str | None = None
    #: Failure history, one dict per failed run (filled by the fault-tolerance layer).
    history: list[dict[str, Any]] = field(default_factory=list)
    #: Retries used, per verdict (``early``, ``late_handled``, ``late_unhandled``).
    counters: dict[str, int] = field(default_factory=dict)
    retry_args: list[str] = field(default_factory=list)
    #: The data of the application's SUCCEEDED line: the files it produced.
    outputs: list[str] = field(default_factory=list)
    #: Transitions a backend asked for that the table refused, kept for the record.
    refused: list[str] = field(default_factory=list)
    #: The newest saved state (``seq``, ``label``, ``final``, ``time``) and the restart
    #: counter (``restart_seq``, ``restarts``); see :mod:`orchestrator.runtime.checkpoints` and
    #: :mod:`orchestrator.core.retry`.
    checkpoint: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True, init=False)
class RunExtra(RunRecord):
    """What only some runs have; every field is part of the run's public ``info``.

    A field never set holds nothing: its empty list or dict is made when it is first read (:meth:`__getattr__`).
    A run with extras mostly has one or two fields (a completed run: its usage), and eight empty containers a
    run were some 500 bytes of each of a 100,000-run job's runs."""

    timestamps: dict[str, float] = field(default_factory=dict)
    #: CPU and wall seconds per attempt, as the wrapper recorded them.
    usage: list[dict[str, Any]] = field(default_factory=list)

    def __init__(self, **fields: Any) -> None:
        self.reason = fields.pop("reason", None)
        for name, value in fields.items():
            setattr(self, name, value)

    def __getattr__(self, name: str) -> Any:
        """A field never set (Python asks only then): its empty container, kept from now on."""
        factory = _EMPTY.get(name)
        if factory is None:
            raise AttributeError(name)
        value = factory()
        setattr(self, name, value)
        return value

    def peek(self, name: str) -> Any:
        """A field's value, ``None`` when it was never set (no empty container is made for it)."""
        try:
            return object.__getattribute__(self, name)
        except AttributeError:
            return None

    def to_dict(self) -> dict[str, Any]:
        """The stored form: only what is set (a clean run's info is ``{}``)."""
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = self.peek(name)
            if value:
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunExtra:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


#: How each of :class:`RunExtra`'s containers starts, made when first read.
_EMPTY: dict[str, Callable[[], Any]] = {
    name: f.default_factory for name, f in RunExtra.__dataclass_fields__.items() if f.default_factory is not MISSING}


def has_saved(checkpoint: Mapping[str, Any]) -> bool:
    """Whether a run's checkpoint record tells of a state it saved (it has a ``seq``)."""
    return checkpoint.get("seq") is not None


def saved_by(extras: Mapping[int, RunExtra]) -> set[int]:
    """The runs among ``extras`` that saved a checkpoint state."""
    return {i for i, extra in extras.items() if (cp := extra.peek("checkpoint")) and has_saved(cp)}


class RunTable:
    """The runs of one top-level job, by index."""

    __slots__ = ("status", "attempt", "times", "extras", "counts", "saved")

    def __init__(self, n: int, status: JobStatus = JobStatus.NEW) -> None:
        self.status = bytearray([status.code]) * n
        self.attempt = array("I", bytes(4 * n))
        self.times = {kind: array("d", bytes(8 * n)) for kind in (*TIMED, "final")}
        self.extras: dict[int, RunExtra] = {}
        self.counts = [0] * len(ALL_STATUSES)
        self.counts[status.code] = n
        #: The runs that saved a checkpoint state (their record has a ``seq``): kept as they save one, so that
        #: the monitor's look each tick costs what the savers number, not what the job's runs do.
        self.saved: set[int] = set()

    @classmethod
    def restore(cls, status: bytearray, attempt: Iterable[int], times: dict[str, Iterable[float]],
                extras: dict[int, RunExtra]) -> RunTable:
        """A table as the repository stored it."""
        table = cls(0)
        table.status = status
        table.attempt = array("I", attempt)
        for kind in table.times:
            table.times[kind] = array("d", times.get(kind, bytes(8 * len(status))))
        table.extras = extras
        table.saved = saved_by(extras)
        table.counts = [status.count(code) for code in range(len(ALL_STATUSES))]  # one pass in C per status
        return table

    def __len__(self) -> int:
        return len(self.status)

    def get(self, index: int) -> JobStatus:
        return JobStatus.from_code(self.status[index])

    def extra(self, index: int) -> RunExtra:
        """The run's extras, made on first use."""
        extra = self.extras.get(index)
        if extra is None:
            extra = self.extras[index] = RunExtra()
        return extra

    def peek(self, index: int, name: str) -> Any:
        """A field of the run's extras, ``None`` when it was never set (nothing is made for the look)."""
        extra = self.extras.get(index)
        return extra.peek(name) if extra is not None else None

    def save_state(self, index: int, state: Mapping[str, Any]) -> None:
        """Fold a state the run saved into its checkpoint record."""
        checkpoint = self.extra(index).checkpoint
        checkpoint.update(state)
        if has_saved(checkpoint):
            self.saved.add(index)

    def forget(self, index: int) -> None:
        """Drop the run's extras: it is as new (no reason, no history, no state)."""
        self.extras.pop(index, None)
        self.saved.discard(index)

    def indexes_in(self, statuses: Iterable[JobStatus]) -> list[int]:
        """Indexes of runs in any of ``statuses``, ascending; skips the scan when the counters say none."""
        codes = [s.code for s in statuses if self.counts[s.code]]
        if not codes:
            return []
        if sum(self.counts[c] for c in codes) == len(self.status):
            return list(range(len(self.status)))
        if len(codes) == 1:
            return positions(self.status, codes[0])
        return positions(self.status.translate(marks_of(codes)), 1)

    def count(self, statuses: Iterable[JobStatus]) -> int:
        return sum(self.counts[s.code] for s in statuses)

    def time_of(self, index: int, status: str) -> float | None:
        """When the run last entered ``status`` (``None``: never)."""
        array_ = self.times.get(status)
        if array_ is not None:
            value = array_[index]
            return value or None
        extra = self.extras.get(index)
        return extra.timestamps.get(status) if extra is not None else None

    def timestamps(self, index: int) -> dict[str, float]:
        """Every entry time the run keeps, by status name (and ``final``)."""
        out = {kind: t for kind in TIMED if (t := self.times[kind][index])}
        extra = self.extras.get(index)
        if extra is not None:
            out.update(extra.timestamps)
        final = self.times["final"][index]
        if final:
            out["final"] = final
            status = self.get(index)
            if status in FINAL:
                out.setdefault(status.value, final)
        return out


def marks_of(codes: Iterable[int]) -> bytes:
    """A ``bytes.translate`` table that marks the byte values ``codes`` with 1 and every other with 0."""
    wanted = set(codes)
    return bytes(1 if c in wanted else 0 for c in range(256))


def positions(data: bytes | bytearray, code: int) -> list[int]:
    """Every position of one byte value, found by ``find`` (C speed, not a Python loop per run)."""
    out: list[int] = []
    needle = bytes([code])
    i = data.find(needle)
    while i != -1:
        out.append(i)
        i = data.find(needle, i + 1)
    return out
