"""The repository: what a home stores (jobs, their run arrays, subjob rows, saved states), behind one interface.

Two implementations keep the same rows with the same semantics: a master's
subjobs are added in one transaction, a tick's changes are written in one
transaction (:class:`Save`), the schema is migrated forward on open, and a
few synchronous look-ups serve the public API's synchronous reads
(``j.subjobs[5].application``).

- :class:`~.sqlite_repository.SqliteRepository`, the default: one file in the
  home, ``<home>/repository.sqlite`` (aiosqlite, WAL). The home's lock
  (:mod:`.homelock`) is what makes its one writer the only one.
- :class:`~.postgres.repository.PgRepository`, chosen by ``[repository] url =
  "postgresql://..."`` (or ``--repository URL``): a PostgreSQL database that
  several homes may share, as an active/standby pair of services does. Its
  writer holds a lease in the database, and every write carries the lease's
  fencing token, so a writer that lost the lease cannot write.

The runtime knows only :class:`Repository`; :class:`~.storage.Storage` picks
the implementation from the settings (``[repository]``) and says where the
files that go with the rows live (the workspace, the drivers' state dirs).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from ..core.errors import RepositoryError


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass(slots=True)
class TopRow:
    """One top-level job. ``spec`` ``None`` in a save: the definition did not change."""

    id: int
    name: str
    status: str
    spec: dict[str, Any] | None
    backend_id: str | None
    info: dict[str, Any]
    n_subjobs: int = 0
    added: float = 0.0


#: The entry times a job's run arrays hold, one array of doubles each (``t_<kind>`` columns).
TIME_KINDS = ("submitting", "submitted", "running", "final")


@dataclass(slots=True)
class RunsRow:
    """A job's run arrays, as the state machine's :class:`~orchestrator.core.table.RunTable` holds them."""

    job: int
    status: bytes
    attempt: bytes
    times: dict[str, bytes]
    #: The runs changed since the job's arrays were last written, as ``[start, stop)`` index ranges (``None``:
    #: any): a repository that can write part of a stored array writes only these (:meth:`Repository.save`).
    changed: tuple[tuple[int, int], ...] | None = None

    def values(self) -> tuple[Any, ...]:
        return (self.job, self.status, self.attempt, *(self.times[k] for k in TIME_KINDS))

    def columns(self) -> tuple[tuple[str, bytes, int], ...]:
        """Each stored array: its column (``status``, ``attempt``, ``t_<kind>``), its bytes, its bytes per run."""
        return (("status", self.status, 1), ("attempt", self.attempt, 4),
                *((f"t_{k}", self.times[k], 8) for k in TIME_KINDS))


def ranges_of(indexes: Iterable[int], *, gap: int = 64) -> tuple[tuple[int, int], ...]:
    """Sorted ``[start, stop)`` ranges covering ``indexes``; ranges less than ``gap`` apart are joined (a write of a
    few bytes more costs less than one more write)."""
    out: list[list[int]] = []
    for i in sorted(indexes):
        if out and i < out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], i + 1)
        else:
            out.append([i, i + 1])
    return tuple((a, b) for a, b in out)


@dataclass(frozen=True, slots=True)
class StateRow:
    """One saved checkpoint state of one job (``data``: the state file's text)."""

    job: str
    seq: int
    time: float
    final: bool
    data: str

    @property
    def label(self) -> str:
        return f"{self.job}:{self.seq}"


@dataclass(slots=True)
class Save:
    """Everything one flush writes, in one transaction."""

    tops: list[TopRow] = field(default_factory=list)
    runs: list[RunsRow] = field(default_factory=list)
    #: (master, index, extras JSON or None)
    infos: list[tuple[int, int, str | None]] = field(default_factory=list)
    #: (job, index or None for a job that runs itself, backend id)
    backend_ids: list[tuple[int, int | None, str | None]] = field(default_factory=list)
    #: (master, index, delta JSON): a subjob's own definition changed (``resubmit(backend=...)``)
    deltas: list[tuple[int, int, str]] = field(default_factory=list)
    states: list[StateRow] = field(default_factory=list)
    keep: int = 0

    def __bool__(self) -> bool:
        return bool(self.tops or self.runs or self.infos or self.backend_ids or self.deltas or self.states)


@dataclass(slots=True)
class Loaded:
    """A home's whole state, as stored: what the runtime restores at open."""

    tops: list[TopRow]
    runs: dict[int, RunsRow]
    #: master -> index -> extras (only runs that have any)
    infos: dict[int, dict[int, dict[str, Any]]]


class Repository(Protocol):
    """What the runtime needs of a repository; see the module docstring."""

    #: Where it is, for messages: a file's path, or a database's URL without its password.
    where: str

    # ------------------------------------------------------------ life
    async def open(self, *, readonly: bool = False) -> None:
        """Open and migrate forward. ``readonly``: read only, as another process last wrote it (never
        migrated, never written, no lease taken). A repository another process writes raises
        :class:`RepositoryHeldError`; a damaged one :class:`~orchestrator.core.errors.RepositoryError`."""

    async def close(self) -> None:
        """Let go: a lease held is given back, so a standby takes over at once."""

    async def home_key(self) -> str:
        """The short id idempotency keys carry (``orch-<key>-<fqid>-<attempt>``): every process that may write
        this repository must use the same one, or a run would be looked up under another's key."""

    async def schema_version(self) -> int: ...

    # ------------------------------------------------------------ the writer's standing
    async def confirm_writer(self) -> None:
        """Before a backend hears of a run: returns once this process is known to be the repository's writer
        (a shared one's lease renewed recently); raises :class:`RepositoryHeldError` if it no longer is."""

    async def lost(self) -> str:
        """Returns (saying why) when this process may no longer write: another took the repository over, or
        its standing could not be confirmed; never, for a repository only this home uses."""

    async def announce(self, address: Mapping[str, Any]) -> None:
        """Say where this process answers (its socket, its TCP port), for the clients of other homes on a
        shared repository; nothing to do for one only this home uses."""

    # ------------------------------------------------------------ writes
    async def next_id(self) -> int: ...
    async def add_job(self, row: TopRow, runs: RunsRow) -> None: ...
    async def store_split(self, master: TopRow, runs: RunsRow, deltas: Iterable[str | None]) -> None:
        """A master's subjobs (their deltas, in index order) and run arrays, with its row, in one transaction."""
    async def remove_split(self, master: TopRow, runs: RunsRow) -> None:
        """Undo a split: no subjob rows, no subjob states, the job's single run again."""
    async def remove_job(self, job_id: int) -> None: ...
    async def save(self, batch: Save) -> None:
        """Write one flush's changes in one transaction; of each job's states only the newest ``keep`` stay."""
    def refuses(self, error: BaseException) -> bool:
        """Whether ``error``, raised by a write, is the repository refusing the values written (a constraint, a
        value it cannot hold: the same rows are refused at every try), not the store failing (busy, full,
        unreachable, taken over: the same rows may go in later). The writer writes a refused flush again job by
        job, and leaves out the changes of the jobs refused (:mod:`.writer`)."""

    # ------------------------------------------------------------ reads
    async def load(self) -> Loaded:
        """Every job (a splitter's parameters left out: :data:`~orchestrator.core.splitters.DEFERRED`), its run
        arrays, and the extras of the runs that have any."""
    def subjob_rows(self, master: int, indexes: Sequence[int]) -> dict[int, tuple[str | None, str | None]]:
        """(backend id, delta JSON) of a master's subjobs, by index (synchronous: the API's look-ups)."""
    def all_deltas(self, master: int, *, start: int = 0, stop: int | None = None) -> list[str | None]:
        """Every subjob's delta of a master, in index order (synchronous); or those of subjobs ``start:stop``."""
    def stored_splitter(self, job: int) -> dict[str, Any] | None:
        """A job's splitter as stored, in full (synchronous)."""
    def top_backend_id(self, job: int) -> str | None: ...
    async def states(self, job: str) -> list[StateRow]:
        """A job's stored states, oldest first."""
    async def state(self, job: str, seq: int | None = None) -> StateRow | None:
        """State ``seq`` of a job, or its newest."""


# ------------------------------------------------------------------ choosing one
POSTGRES_SCHEMES = ("postgresql", "postgres")


def shown_url(url: str) -> str:
    """A database URL as messages show it: its password left out."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[2]}"))


def closed(where: str) -> RepositoryError:
    """What a read of a closed repository raises: a job object outlives the orchestrator it came from, and a
    detail it must read from the home (a subjob's definition, say) cannot be had once that home is closed."""
    return RepositoryError(f"{where} is closed: the orchestrator this job came from was closed; open the home "
                           "again to read its jobs' details", path=where)
