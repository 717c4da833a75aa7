"""Fully qualified job ids: ``(3, 1)`` is subjob 1 of job 3, written ``"3.1"``."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence

FQID = tuple[int, ...]


def parse_fqid(value: int | str | tuple[int, ...] | list[int]) -> FQID:
    """``3``, ``"3.1"``, ``(3, 1)`` or ``[3, 1]`` as a tuple; ``ValueError`` otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"not a job id: {value!r}")
    if isinstance(value, int):
        parts: tuple[int, ...] = (value,)
    elif isinstance(value, str):
        try:
            parts = tuple(int(p) for p in value.strip().split("."))
        except ValueError:
            raise ValueError(f"not a job id: {value!r} (expected e.g. '3' or '3.1')") from None
    elif isinstance(value, (tuple, list)):
        if not all(isinstance(p, int) and not isinstance(p, bool) for p in value):
            raise ValueError(f"not a job id: {value!r}")
        parts = tuple(value)
    else:
        raise ValueError(f"not a job id: {value!r}")
    if not parts or any(p < 0 for p in parts):
        raise ValueError(f"not a job id: {value!r}")
    return parts


def fqid_str(fqid: FQID) -> str:
    return ".".join(str(p) for p in fqid)


def parse_fqid_or_none(value: object) -> FQID | None:
    """A backend's fqid string as a tuple, or ``None`` when it is not one (never raises)."""
    if not isinstance(value, str):
        return None
    try:
        fq = tuple(int(p) for p in value.split("."))
    except ValueError:
        return None
    return fq if fq and all(p >= 0 for p in fq) else None


class Runs:
    """A batch of runs of one top-level job, in order: subjobs ``indexes`` of job ``job``, or the job itself.

    The unit in which the core speaks about runs (instructions, reports): bulk
    first, and compact, so a batch of a million subjobs is a ``range`` or an
    ``array``, never a million tuples. ``indexes is None`` means the top-level
    job ``job`` runs itself (it has no subjobs).
    """

    __slots__ = ("job", "indexes")

    def __init__(self, job: int, indexes: Sequence[int] | None = None) -> None:
        self.job = job
        self.indexes = indexes

    @classmethod
    def of(cls, job: int, indexes: Iterable[int] | None) -> Runs:
        """A batch from any iterable of indexes (kept as a ``range`` when they are consecutive)."""
        if indexes is None or isinstance(indexes, range):
            return cls(job, indexes)
        items = indexes if isinstance(indexes, array) else array("q", indexes)
        return cls(job, as_range(items) or items)

    @property
    def whole(self) -> bool:
        """The batch is the top-level job itself."""
        return self.indexes is None

    def __len__(self) -> int:
        return 1 if self.indexes is None else len(self.indexes)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[FQID]:
        if self.indexes is None:
            yield (self.job,)
        else:
            job = self.job
            for i in self.indexes:
                yield (job, i)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Runs):
            return NotImplemented
        if self.job != other.job or (self.indexes is None) != (other.indexes is None):
            return False
        return self.indexes is None or list(self.indexes) == list(other.indexes or ())

    def __hash__(self) -> int:
        return hash((self.job, None if self.indexes is None else len(self.indexes)))

    def __repr__(self) -> str:
        if self.indexes is None:
            return f"Runs({self.job})"
        idx = self.indexes
        shown = f"{idx.start}..{idx.stop - 1}" if isinstance(idx, range) else ",".join(map(str, list(idx)[:8]))
        more = "" if isinstance(idx, range) or len(idx) <= 8 else f",... ({len(idx)})"
        return f"Runs({self.job}.[{shown}{more}])"

    def fqids(self) -> tuple[FQID, ...]:
        return tuple(self)


def as_range(indexes: Sequence[int]) -> range | None:
    """``indexes`` as the ``range`` they are when they are consecutive and ascending, else ``None`` (compared in
    C: a million runs, one range)."""
    if isinstance(indexes, range):
        return indexes if indexes.step == 1 else None
    if not indexes or indexes[-1] - indexes[0] + 1 != len(indexes):
        return None
    whole = range(indexes[0], indexes[-1] + 1)
    items = indexes if isinstance(indexes, array) else array("q", indexes)
    return whole if items == array("q", whole) else None


#: What a command line may name: ``3``, ``3.1``, ``3-5`` or ``[3-5,8]`` (jobs), ``3.0-99`` or ``3.[0-9,12]``
#: (subjobs of 3), as ``scancel`` and Ganga's ``select(ids=...)`` allow.
ID_FORMS = "3, 3.1, 3-5, 3.0-99 or 3.[0-9,12]"


def _index_list(text: str, whole: str) -> list[int]:
    """``0-9,12`` (brackets already taken off) as ascending, distinct indexes."""
    out: list[int] = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"not a job id or range: {whole!r} (expected e.g. {ID_FORMS})") from None
        if first < 0 or last < first:
            raise ValueError(f"not a job id or range: {whole!r} ({part.strip()} is empty; expected e.g. {ID_FORMS})")
        out.extend(range(first, last + 1))
    return sorted(set(out))


def parse_id_range(text: str) -> list[tuple[FQID, Sequence[int] | None]]:
    """One command-line id or range, as ``(prefix, indexes)`` pairs.

    ``indexes is None``: the pair names the job ``prefix`` itself (``3``, ``3.1``, each of ``3-5``);
    else it names those subjobs of ``prefix`` (``3.0-99`` → ``((3,), range(0, 100))``). Only the last part may be
    a range; ``ValueError`` with the forms allowed otherwise.
    """
    value = text.strip()
    head, _, last = value.rpartition(".")
    ranged = last.startswith("[") or "-" in last or "," in last
    if not ranged:
        try:
            return [(parse_fqid(value), None)]
        except ValueError:
            raise ValueError(f"not a job id or range: {text!r} (expected e.g. {ID_FORMS})") from None
    if last.startswith("["):
        if not last.endswith("]"):
            raise ValueError(f"not a job id or range: {text!r} (expected e.g. {ID_FORMS})")
        last = last[1:-1]
    indexes = _index_list(last, text)
    if not head:
        return [((i,), None) for i in indexes]
    try:
        prefix = parse_fqid(head)
    except ValueError:
        raise ValueError(f"not a job id or range: {text!r} (expected e.g. {ID_FORMS})") from None
    whole = as_range(indexes)
    return [(prefix, whole if whole is not None else tuple(indexes))]
