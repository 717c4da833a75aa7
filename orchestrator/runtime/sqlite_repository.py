"""The SQLite repository: jobs, their run arrays, subjob rows and saved states, in one file (aiosqlite, WAL).

Writes are batched: one transaction stores a split (the subjob rows and
the master's run arrays), one transaction writes everything a tick changed
(:class:`Save`). Reads of single subjobs go through a small synchronous
read connection, because the public API is synchronous where it looks jobs
up (``j.subjobs[5].application``): in WAL mode a reader never blocks the
writer, and reading one row by its key costs microseconds.

It is the default implementation of :class:`~.repository.Repository`: the
home's own file, which the home's lock keeps to one writer.
"""

from __future__ import annotations

import json
import secrets
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiosqlite
import anyio

from ..core.errors import RepositoryError
from ..core.ids import as_range
from ..core.splitters import is_deferred
from . import schema, sqlite
from .repository import Loaded, RunsRow, Save, StateRow, TopRow, closed, dumps


def home_key(home: Path) -> str:
    """A short id of this home, stable across runs, used in idempotency keys (``<home>/home-id``)."""
    path = home / "home-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        key = secrets.token_hex(4)
        path.write_text(key + "\n")
        return key


#: A job's stored definition as ``load`` reads it: its splitter's parameters (a million arguments are
#: 10 MB of JSON, 0.8 s to decode in Python) left out by SQLite's JSON functions, in C, in 0.09 s.
#: A definition SQLite calls malformed (NaN or Infinity, which an earlier version let in) is read whole: the bulk
#: query raised, and the home did not open; :func:`~.writer.restore` leaves that job out, saying why.
_SPEC_WITHOUT_SPLITTER = ("CASE WHEN NOT json_valid(spec) THEN spec "
                          "WHEN json_type(spec, '$.splitter') = 'object' THEN json_set(spec, '$.splitter', "
                          "json_object('plugin', json_extract(spec, '$.splitter.plugin'), 'deferred', json('true'))) "
                          "ELSE spec END")


class SqliteRepository(sqlite.Connected):
    """The SQLite repository of one home; see the module docstring."""

    what = "the repository"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)
        self._db: aiosqlite.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        #: One connection, one transaction at a time.
        self._tx_lock = anyio.Lock()

    # ------------------------------------------------------------ life
    async def open(self, *, readonly: bool = False) -> None:
        """Open (and migrate) the file; a damaged one raises :class:`~orchestrator.core.errors.RepositoryError`.

        ``readonly``: read a home another process holds, as it is (never migrated, never written)."""
        if readonly and not self.path.exists():
            raise RepositoryError(f"{self.path} does not exist (yet): nothing to read", path=str(self.path))
        with sqlite.guarded(self.path):
            self._db = await sqlite.connect(self.path, readonly=readonly)
            try:
                version = await sqlite.checked_version(self._db, self.path, schema.VERSION, readonly=readonly)
                if version < schema.VERSION and readonly:
                    raise RepositoryError(f"{self.path} has schema version {version}, older than this "
                                          f"orchestrator's {schema.VERSION}, and another process holds the home: "
                                          "read it once that process is done", path=str(self.path))
                if version < schema.VERSION:
                    async with sqlite.immediate(self._db):
                        await schema.migrate(self._db, version)
                        await self._db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                                               (str(schema.VERSION),))
                reader = sqlite.reader(self.path, readonly=readonly)
                self._reader = reader
            except BaseException:
                await self.close()
                raise

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        await super().close()

    @property
    def reader(self) -> sqlite3.Connection:
        if self._reader is None:
            raise closed(self.where)
        return self._reader

    async def schema_version(self) -> int:
        return await sqlite.schema_version(self.db)

    async def home_key(self) -> str:
        return home_key(self.path.parent)

    # ------------------------------------------------------------ the writer's standing: the home's lock
    async def confirm_writer(self) -> None:
        """The home's lock, held since the home was opened, is this process's standing: nothing to check."""

    async def lost(self) -> str:
        """Nobody takes a home's own file over while its lock is held."""
        await anyio.sleep_forever()
        return ""

    async def announce(self, address: Mapping[str, Any]) -> None:
        """Clients find the service through the home (``<home>/service``): nothing to publish."""

    # ------------------------------------------------------------ writes
    async def _transaction(self, statements: Iterable[tuple[str, Any, bool]],
                           patches: Sequence[RunsRow] = ()) -> None:
        async with self._tx_lock, sqlite.immediate(self.db):
            for sql, params, many in statements:
                if many:
                    await self.db.executemany(sql, params)
                else:
                    await self.db.execute(sql, params)
            if patches:
                await sqlite.in_thread(self.db, _patch_runs, patches)

    async def next_id(self) -> int:
        with sqlite.guarded(self.path):
            return await self._next_id()

    async def _next_id(self) -> int:
        async with self.db.execute("SELECT value FROM meta WHERE key='next_id'") as cur:
            row = await cur.fetchone()
        async with self.db.execute("SELECT COALESCE(MAX(id), -1) + 1 FROM jobs") as cur:
            top = await cur.fetchone()
        assert top is not None
        return max(int(row[0]) if row else 0, int(top[0]))

    async def add_job(self, row: TopRow, runs: RunsRow) -> None:
        await self._transaction([
            ("INSERT INTO jobs (id, name, status, spec, backend_id, info, n_subjobs, master, added) "
             "VALUES (?, ?, ?, ?, ?, ?, 0, NULL, ?)",
             (row.id, row.name, row.status, dumps(row.spec), row.backend_id, dumps(row.info), row.added), False),
            ("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)", runs.values(), False),
            ("INSERT OR REPLACE INTO meta VALUES ('next_id', ?)", (str(row.id + 1),), False),
        ])

    async def store_split(self, master: TopRow, runs: RunsRow, deltas: Iterable[str | None]) -> None:
        """A master's subjobs (their deltas, in index order) and run arrays, with its row, in one transaction."""
        job = master.id
        await self._transaction([
            ("INSERT INTO subjobs (master, idx, backend_id, info, delta) VALUES (?, ?, NULL, NULL, ?)",
             ((job, i, d) for i, d in enumerate(deltas)), True),
            ("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)", runs.values(), False),
            *self._top_update([master]),
        ])

    async def remove_split(self, master: TopRow, runs: RunsRow) -> None:
        """Undo a split: no subjob rows, no subjob states, the job's single run again."""
        await self._transaction([
            ("DELETE FROM subjobs WHERE master = ?", (master.id,), False),
            ("DELETE FROM states WHERE job LIKE ?", (f"{master.id}.%",), False),
            ("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)", runs.values(), False),
            *self._top_update([master]),
        ])

    async def remove_job(self, job_id: int) -> None:
        await self._transaction([
            ("DELETE FROM subjobs WHERE master = ?", (job_id,), False),
            ("DELETE FROM runs WHERE job = ?", (job_id,), False),
            ("DELETE FROM jobs WHERE id = ?", (job_id,), False),
            ("DELETE FROM states WHERE job = ? OR job LIKE ?", (str(job_id), f"{job_id}.%"), False),
        ])

    @staticmethod
    def _top_update(rows: Sequence[TopRow]) -> list[tuple[str, Any, bool]]:
        """A top-level row's state (its backend id has an update of its own: ``Save.backend_ids``)."""
        with_spec = [(r.name, r.status, dumps(r.spec), dumps(r.info), r.n_subjobs, r.id)
                     for r in rows if r.spec is not None and not is_deferred(r.spec.get("splitter"))]
        keep_splitter = [(r.name, r.status, dumps(r.spec), dumps(r.info), r.n_subjobs, r.id)
                         for r in rows if r.spec is not None and is_deferred(r.spec.get("splitter"))]
        plain = [(r.name, r.status, dumps(r.info), r.n_subjobs, r.id) for r in rows if r.spec is None]
        out: list[tuple[str, Any, bool]] = []
        if with_spec:
            out.append(("UPDATE jobs SET name=?, status=?, spec=?, info=?, n_subjobs=? WHERE id=?", with_spec, True))
        if keep_splitter:  # a spec loaded without its splitter's parameters: the stored splitter stays
            out.append(("UPDATE jobs SET name=?, status=?, spec=json_set(?, '$.splitter', spec -> '$.splitter'), "
                        "info=?, n_subjobs=? WHERE id=?", keep_splitter, True))
        if plain:
            out.append(("UPDATE jobs SET name=?, status=?, info=?, n_subjobs=? WHERE id=?", plain, True))
        return out

    async def save(self, batch: Save) -> None:
        """Write one flush's changes in one transaction; of each job's states only the newest ``keep`` stay."""
        statements = self._top_update(batch.tops)
        whole = [r for r in batch.runs if r.changed is None]
        if whole:
            statements.append(("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)",
                               [r.values() for r in whole], True))
        if batch.infos:
            statements.append(("UPDATE subjobs SET info=? WHERE master=? AND idx=?",
                               [(info, m, i) for m, i, info in batch.infos], True))
        subs = [(b, m, i) for m, i, b in batch.backend_ids if i is not None]
        tops = [(b, m) for m, i, b in batch.backend_ids if i is None]
        if subs:
            statements.append(("UPDATE subjobs SET backend_id=? WHERE master=? AND idx=?", subs, True))
        if tops:
            statements.append(("UPDATE jobs SET backend_id=? WHERE id=?", tops, True))
        if batch.deltas:
            statements.append(("UPDATE subjobs SET delta=? WHERE master=? AND idx=?",
                               [(d, m, i) for m, i, d in batch.deltas], True))
        if batch.states:
            statements.append(("INSERT OR REPLACE INTO states (job, seq, time, final, data) VALUES (?, ?, ?, ?, ?)",
                               [(r.job, r.seq, r.time, int(r.final), r.data) for r in batch.states], True))
            if batch.keep > 0:
                jobs = sorted({r.job for r in batch.states})
                statements.append(("DELETE FROM states WHERE job = ? AND seq <= "
                                   "(SELECT MAX(seq) FROM states WHERE job = ?) - ?",
                                   [(j, j, batch.keep) for j in jobs], True))
        patches = [r for r in batch.runs if r.changed is not None]
        if statements or patches:
            await self._transaction(statements, patches)

    def refuses(self, error: BaseException) -> bool:
        return sqlite.refuses(error)

    # ------------------------------------------------------------- reads
    async def load(self) -> Loaded:
        """Every job, its run arrays, and the extras of the runs that have any (a damaged file: ``RepositoryError``)."""
        with sqlite.guarded(self.path):
            return await self._load()

    async def _load(self) -> Loaded:
        async with self.db.execute(f"SELECT id, name, status, {_SPEC_WITHOUT_SPLITTER}, backend_id, info, n_subjobs, "
                                   "added FROM jobs ORDER BY id") as cur:
            rows = await cur.fetchall()
        tops = [TopRow(r[0], r[1], r[2], json.loads(r[3]), r[4], json.loads(r[5]), r[6], r[7]) for r in rows]
        async with self.db.execute("SELECT * FROM runs") as cur:
            runs = {r[0]: RunsRow(r[0], r[1], r[2], {c[2:]: r[3 + k] for k, c in enumerate(schema.TIME_COLUMNS)})
                    for r in await cur.fetchall()}
        infos: dict[int, dict[int, dict[str, Any]]] = {}
        async with self.db.execute("SELECT master, idx, info FROM subjobs WHERE info IS NOT NULL") as cur:
            for master, idx, info in await cur.fetchall():
                infos.setdefault(master, {})[idx] = json.loads(info)
        return Loaded(tops, runs, infos)

    def subjob_rows(self, master: int, indexes: Sequence[int]) -> dict[int, tuple[str | None, str | None]]:
        """(backend id, delta JSON) of a master's subjobs, by index, in one query per 900 (or one in all, when the
        indexes are a run of consecutive ones: a million monitored subjobs after a restart)."""
        if len(indexes) > 900 and as_range(indexes) is not None:
            return {idx: (backend_id, delta) for idx, backend_id, delta in self.reader.execute(
                "SELECT idx, backend_id, delta FROM subjobs WHERE master=? AND idx >= ? AND idx <= ?",
                (master, indexes[0], indexes[-1]))}
        out: dict[int, tuple[str | None, str | None]] = {}
        for start in range(0, len(indexes), 900):
            chunk = list(indexes[start:start + 900])
            marks = ",".join("?" * len(chunk))
            for idx, backend_id, delta in self.reader.execute(
                    f"SELECT idx, backend_id, delta FROM subjobs WHERE master=? AND idx IN ({marks})",
                    (master, *chunk)):
                out[idx] = (backend_id, delta)
        return out

    def all_deltas(self, master: int, *, start: int = 0, stop: int | None = None) -> list[str | None]:
        """Every subjob's delta of a master, in index order (one query); or those of subjobs ``start:stop``."""
        if start == 0 and stop is None:
            return [d for (d,) in self.reader.execute("SELECT delta FROM subjobs WHERE master=? ORDER BY idx",
                                                      (master,))]
        return [d for (d,) in self.reader.execute("SELECT delta FROM subjobs WHERE master=? AND idx >= ? AND idx < ? "
                                                  "ORDER BY idx", (master, start, 2**62 if stop is None else stop))]

    def stored_splitter(self, job: int) -> dict[str, Any] | None:
        """A job's splitter as stored (``load`` leaves its parameters out)."""
        row = self.reader.execute("SELECT json_extract(spec, '$.splitter') FROM jobs WHERE id=?", (job,)).fetchone()
        return json.loads(row[0]) if row and row[0] else None

    def top_backend_id(self, job: int) -> str | None:
        row = self.reader.execute("SELECT backend_id FROM jobs WHERE id=?", (job,)).fetchone()
        return row[0] if row else None

    async def states(self, job: str) -> list[StateRow]:
        """A job's stored states, oldest first."""
        async with self.db.execute("SELECT job, seq, time, final, data FROM states WHERE job = ? ORDER BY seq",
                                   (job,)) as cur:
            rows = await cur.fetchall()
        return [StateRow(r[0], r[1], r[2], bool(r[3]), r[4]) for r in rows]

    async def state(self, job: str, seq: int | None = None) -> StateRow | None:
        """State ``seq`` of a job, or its newest."""
        sql = "SELECT job, seq, time, final, data FROM states WHERE job = ?"
        params: tuple[Any, ...] = (job,)
        if seq is None:
            sql += " ORDER BY seq DESC LIMIT 1"
        else:
            sql, params = sql + " AND seq = ?", (job, seq)
        async with self.db.execute(sql, params) as cur:
            r = await cur.fetchone()
        return StateRow(r[0], r[1], r[2], bool(r[3]), r[4]) if r else None


def _patch_runs(conn: sqlite3.Connection, rows: Sequence[RunsRow]) -> None:
    """(the connection's thread, inside the flush's transaction) Write only the changed runs' bytes of each
    stored array, by SQLite's incremental blob I/O: a job of a hundred thousand runs holds 3.7 MB of arrays, and
    a flush that rewrote them all wrote that much each tick for a dozen runs that moved (28 ms of CPU at 100,000
    runs, five times a second, growing with the job). A row missing, or of another length, is written whole."""
    for row in rows:
        assert row.changed is not None
        stored = conn.execute("SELECT length(status) FROM runs WHERE job = ?", (row.job,)).fetchone()
        if stored is None or stored[0] != len(row.status):  # a new job, or split again: its arrays are new
            conn.execute("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)", row.values())
            continue
        for column, data, size in row.columns():
            with conn.blobopen("runs", column, row.job) as blob:
                for start, stop in row.changed:
                    blob.seek(start * size)
                    blob.write(data[start * size:stop * size])
