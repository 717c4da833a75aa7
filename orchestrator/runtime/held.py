"""The runs a driver answered for, held until they end: a few bytes each, a handle made only when asked for.

An actor holds every run its driver accepted, so that monitoring knows
what to ask about and a kill knows what to kill. A :class:`RunHandle` per
run, held for the whole run, is about a kilobyte (two paths, three strings,
a dataclass): a gigabyte at a million runs, and a million objects for the
cyclic garbage collector to walk again and again. So :class:`HeldRuns`
keeps, per top-level job, what a handle is made of in arrays: the status
the core last recorded (one byte; 0 is "not held"), the attempt, the
backend id packed into one buffer (:class:`PackedStrings`), and the backend
settings, shared by the job's runs unless a run has its own. A handle is
built from them when one is needed: for a kill, for the end of a run whose
log must be read, for a driver's ``track`` after a restart.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from itertools import accumulate
from typing import Any

from ..core.ids import as_range
from ..core.statuses import JobStatus
from ..core.table import marks_of, positions
from ..plugin.contract import RunHandle

#: A run as an actor holds it: (job, subjob index or None for a job that runs itself).
RunKey = tuple[int, int | None]
#: Builds a run's handle: (key, backend id, settings, status, attempt).
MakeHandle = Callable[[RunKey, str, Mapping[str, Any], JobStatus, int], RunHandle]

_ABSENT = 0xFFFFFFFF
#: Status byte -> 1 for a held run, 0 for a free slot (finds held runs at C speed).
_HELD = marks_of(range(1, 256))


class PackedStrings:
    """Strings by index in one buffer: a million backend ids cost their bytes and 12 bytes of offsets, no object
    each. Setting an index again leaves the old bytes behind until they are a majority, then the buffer is
    compacted."""

    __slots__ = ("_data", "_start", "_size", "_waste")

    def __init__(self) -> None:
        self._data = bytearray()
        self._start = array("Q")
        self._size = array("I")
        self._waste = 0

    def __len__(self) -> int:
        return len(self._size)

    @property
    def nbytes(self) -> int:
        """The buffer's size (the strings held, and overwritten ones not yet compacted away)."""
        return len(self._data)

    def grow(self, n: int) -> None:
        """Room for indexes up to ``n - 1``."""
        more = n - len(self._size)
        if more > 0:
            self._start.extend(array("Q", bytes(8 * more)))
            self._size.extend(array("I", [_ABSENT]) * more)

    def set(self, i: int, value: str) -> None:
        old = self._size[i]
        if old != _ABSENT:
            self._waste += old
        raw = value.encode()
        self._start[i] = len(self._data)
        self._size[i] = len(raw)
        self._data += raw
        if self._waste > 1 << 20 and self._waste * 2 > len(self._data):
            self._compact()

    def set_slice(self, lo: int, values: Sequence[str]) -> None:
        """:meth:`set` for indexes ``lo``, ``lo + 1``... in one go."""
        hi = lo + len(values)
        old = self._size[lo:hi]
        self._waste += sum(old) - _ABSENT * old.count(_ABSENT)
        raw = [v.encode() for v in values]
        sizes = array("I", map(len, raw))
        self._start[lo:hi] = array("Q", accumulate(sizes, initial=len(self._data)))[:-1]
        self._size[lo:hi] = sizes
        self._data += b"".join(raw)
        if self._waste > 1 << 20 and self._waste * 2 > len(self._data):
            self._compact()

    def get(self, i: int) -> str | None:
        size = self._size[i]
        if size == _ABSENT:
            return None
        start = self._start[i]
        return self._data[start:start + size].decode()

    def clear(self, i: int) -> None:
        size = self._size[i]
        if size != _ABSENT:
            self._waste += size
            self._size[i] = _ABSENT

    def _compact(self) -> None:
        data = bytearray()
        for i, size in enumerate(self._size):
            if size != _ABSENT:
                start = self._start[i]
                self._start[i] = len(data)
                data += self._data[start:start + size]
        self._data, self._waste = data, 0


class _JobRuns:
    """The held runs of one top-level job, by index (a job that runs itself is index 0)."""

    __slots__ = ("whole", "status", "attempt", "ids", "settings", "own", "count")

    def __init__(self, whole: bool, settings: Mapping[str, Any]) -> None:
        self.whole = whole
        self.status = bytearray()
        self.attempt = array("I")
        self.ids = PackedStrings()
        #: The settings most of the job's runs were submitted with; ``own``: runs with settings of their own.
        self.settings = settings
        self.own: dict[int, Mapping[str, Any]] = {}
        self.count = 0

    def grow(self, n: int) -> None:
        more = n - len(self.status)
        if more > 0:
            self.status.extend(bytes(more))
            self.attempt.extend(array("I", bytes(4 * more)))
            self.ids.grow(n)


class HeldRuns:
    """Every run one driver holds; see the module docstring."""

    def __init__(self, make_handle: MakeHandle) -> None:
        self._make = make_handle
        self._jobs: dict[int, _JobRuns] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        job, i = key
        runs = self._jobs.get(job)
        if runs is None:
            return False
        if i is None:
            return runs.whole and bool(runs.status) and runs.status[0] != 0
        return not runs.whole and i < len(runs.status) and runs.status[i] != 0

    # ------------------------------------------------------------ adding
    def add(self, key: RunKey, backend_id: str, attempt: int, settings: Mapping[str, Any],
            status: JobStatus = JobStatus.SUBMITTED) -> None:
        job, index = key
        self.add_many(job, None if index is None else [index], [backend_id], [attempt], [settings], status)

    def add_many(self, job: int, indexes: Sequence[int] | None, backend_ids: Sequence[str], attempts: Sequence[int],
                 settings: Sequence[Mapping[str, Any]],
                 status: JobStatus | Sequence[JobStatus] = JobStatus.SUBMITTED) -> None:
        """Hold runs of ``job`` (``indexes`` ``None``: the job itself, which runs without subjobs), all in
        ``status`` or each in its own."""
        if not backend_ids:
            return
        runs = self._jobs.get(job)
        if runs is None:
            runs = self._jobs[job] = _JobRuns(indexes is None, settings[0])
        if indexes is None:
            indexes = [0]
        n = len(backend_ids)
        codes = bytes([status.code]) * n if isinstance(status, JobStatus) else bytes(s.code for s in status)
        lo, hi = indexes[0], indexes[-1] + 1
        runs.grow(max(indexes) + 1)
        if hi - lo == n and as_range(indexes) is not None:
            # one slice (a chunk submitted together): status, attempts and ids set in C
            newly = runs.status.count(0, lo, hi)
            runs.status[lo:hi] = codes
            runs.attempt[lo:hi] = array("I", attempts)
            runs.ids.set_slice(lo, backend_ids)
        else:
            newly = 0
            for i, backend_id, attempt, code in zip(indexes, backend_ids, attempts, codes, strict=True):
                newly += not runs.status[i]
                runs.status[i] = code
                runs.attempt[i] = attempt
                runs.ids.set(i, backend_id)
        runs.count += newly
        self._count += newly
        same: dict[int, bool] = {}  # one comparison per settings object, not per run
        common = runs.settings
        for i, s in zip(indexes, settings, strict=True):
            shared = same.get(id(s))
            if shared is None:
                shared = same[id(s)] = s is common or s == common
            if shared:
                runs.own.pop(i, None)
            else:
                runs.own[i] = s

    # ------------------------------------------------------------ reading
    def _slot(self, key: RunKey) -> tuple[_JobRuns, int] | None:
        runs = self._jobs.get(key[0])
        if runs is None:
            return None
        i = 0 if key[1] is None else key[1]
        if (key[1] is None) != runs.whole or i >= len(runs.status) or not runs.status[i]:
            return None
        return runs, i

    def status(self, key: RunKey) -> JobStatus | None:
        """The status the core last recorded for a held run; ``None``: not held."""
        slot = self._slot(key)
        return None if slot is None else JobStatus.from_code(slot[0].status[slot[1]])

    def set_status(self, key: RunKey, status: JobStatus) -> None:
        slot = self._slot(key)
        if slot is not None:
            slot[0].status[slot[1]] = status.code

    def attempt(self, key: RunKey) -> int | None:
        """The attempt a held run is at; ``None``: not held."""
        slot = self._slot(key)
        return None if slot is None else slot[0].attempt[slot[1]]

    def has_job(self, job: int) -> bool:
        """Whether any run of ``job`` is held."""
        return job in self._jobs

    def settings(self, key: RunKey) -> Mapping[str, Any] | None:
        slot = self._slot(key)
        return None if slot is None else slot[0].own.get(slot[1], slot[0].settings)

    def handle(self, key: RunKey) -> RunHandle | None:
        """The run's handle, made now; ``None``: not held."""
        slot = self._slot(key)
        if slot is None:
            return None
        runs, i = slot
        backend_id = runs.ids.get(i)
        assert backend_id is not None
        return self._make(key, backend_id, runs.own.get(i, runs.settings), JobStatus.from_code(runs.status[i]),
                          runs.attempt[i])

    def handles(self, job: int, indexes: Sequence[int] | None) -> list[RunHandle]:
        """The handles of these runs of ``job`` that are held (``None``: the job itself), made now."""
        runs = self._jobs.get(job)
        if runs is None or (indexes is None) != runs.whole:
            return []
        make, status, attempt, ids, own, common = (self._make, runs.status, runs.attempt, runs.ids, runs.own,
                                                     runs.settings)
        out = []
        for i in indexes if indexes is not None else [0]:
            if i < len(status) and status[i]:
                backend_id = ids.get(i)
                assert backend_id is not None
                out.append(make((job, None if indexes is None else i), backend_id, own.get(i, common),
                                JobStatus.from_code(status[i]), attempt[i]))
        return out

    def jobs(self) -> list[int]:
        return list(self._jobs)

    def keys(self, job: int | None = None) -> Iterator[RunKey]:
        """Held runs, of one job or of all, by job then index."""
        for j in ([job] if job is not None else list(self._jobs)):
            runs = self._jobs.get(j)
            if runs is None:
                continue
            if runs.whole:
                if runs.status and runs.status[0]:
                    yield (j, None)
                continue
            if runs.count == len(runs.status):  # every slot held: no search
                yield from ((j, k) for k in range(len(runs.status)))
            else:
                yield from ((j, k) for k in positions(runs.status.translate(_HELD), 1))

    def keys_in(self, job: int, statuses: Collection[JobStatus]) -> list[RunKey]:
        """The held runs of ``job`` the core last recorded in one of ``statuses``: a scan in C of the status
        bytes (the monitor's look for running runs among a hundred thousand queued ones costs microseconds)."""
        runs = self._jobs.get(job)
        if runs is None:
            return []
        codes = {s.code for s in statuses}
        if runs.whole:
            return [(job, None)] if runs.status and runs.status[0] in codes else []
        return [(job, k) for k in positions(runs.status.translate(marks_of(codes)), 1)]

    # ------------------------------------------------------------ letting go
    def discard(self, key: RunKey) -> bool:
        """Let go of a run; whether it was held."""
        slot = self._slot(key)
        if slot is None:
            return False
        runs, i = slot
        runs.status[i] = 0
        runs.ids.clear(i)
        runs.own.pop(i, None)
        runs.count -= 1
        self._count -= 1
        if not runs.count:
            del self._jobs[key[0]]
        return True

    def set_statuses(self, job: int, indexes: Sequence[int], status: JobStatus) -> None:
        """:meth:`set_status` for many runs of one job (those not held are passed over)."""
        runs = self._jobs.get(job)
        if runs is None:
            return
        codes, code, n = runs.status, status.code, len(runs.status)
        for i in indexes:
            if i < n and codes[i]:
                codes[i] = code

    def discard_many(self, job: int, indexes: Sequence[int]) -> None:
        """:meth:`discard` for many runs of one job (``indexes`` of a job that runs itself: ``[0]``)."""
        runs = self._jobs.get(job)
        if runs is None:
            return
        codes, clear, own = runs.status, runs.ids.clear, runs.own
        gone = 0
        for i in indexes:
            if codes[i]:
                codes[i] = 0
                clear(i)
                gone += 1
        if own:
            for i in indexes:
                own.pop(i, None)
        runs.count -= gone
        self._count -= gone
        if not runs.count:
            del self._jobs[job]

    def discard_job(self, job: int) -> None:
        """Every held run of ``job``."""
        runs = self._jobs.pop(job, None)
        if runs is not None:
            self._count -= runs.count

    def pop(self, key: RunKey) -> RunHandle | None:
        """Let go of a run; its handle, or ``None`` when it was not held."""
        handle = self.handle(key)
        if handle is not None:
            self.discard(key)
        return handle
