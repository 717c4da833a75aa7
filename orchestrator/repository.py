"""The repository: jobs and subjobs in one SQLite file (aiosqlite, WAL).

Writes go through aiosqlite, batched: one transaction adds all of a
master's subjobs, one transaction writes a tick's status changes. Reads of
single subjobs go through a small synchronous read connection, because the
public API is synchronous where it looks jobs up (``j.subjobs[5]``): in WAL
mode a reader never blocks the writer, and reading one row by its primary
key costs microseconds. Subjob objects are thus built only when asked for.

One process owns a home at a time: :class:`HomeLock` takes an exclusive
``flock`` on ``<home>/lock``; a second process is refused with an error
naming the holder's PID and host.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite
import anyio

from . import sqlite
from .errors import HomeLockedError
from .status import JobStatus

SCHEMA_VERSION = 2

_MIGRATIONS: dict[int, list[str]] = {
    1: [
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE jobs (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            status TEXT NOT NULL,
            spec TEXT NOT NULL,
            backend_id TEXT,
            info TEXT NOT NULL,
            n_subjobs INTEGER NOT NULL DEFAULT 0,
            master TEXT
        )""",
        """CREATE TABLE subjobs (
            master INTEGER NOT NULL,
            idx INTEGER NOT NULL,
            name TEXT NOT NULL,
            status TEXT NOT NULL,
            spec TEXT NOT NULL,
            backend_id TEXT,
            info TEXT NOT NULL,
            PRIMARY KEY (master, idx)
        ) WITHOUT ROWID""",
    ],
    # Checkpoint states (DataGrid): the last few of each job, by job fqid ("3", "3.1") and sequence number.
    2: [
        """CREATE TABLE states (
            job TEXT NOT NULL,
            seq INTEGER NOT NULL,
            time REAL NOT NULL,
            final INTEGER NOT NULL,
            data TEXT NOT NULL,
            PRIMARY KEY (job, seq)
        ) WITHOUT ROWID""",
    ],
}


@dataclass(slots=True)
class JobRow:
    """One stored job or subjob; ``idx`` is ``None`` for a top-level job."""

    id: int
    idx: int | None
    name: str
    status: str
    #: ``None`` in a save: the definition did not change, leave it as stored.
    spec: dict[str, Any] | None
    backend_id: str | None
    info: dict[str, Any]
    n_subjobs: int = 0
    master: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class StateRow:
    """One saved state of one job; ``data`` is the state file's text (see :mod:`orchestrator.checkpoint`)."""

    job: str
    seq: int
    time: float
    final: bool
    data: str

    @property
    def label(self) -> str:
        return f"{self.job}:{self.seq}"


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


#: The lock holder's name for ``orchestrator serve``.
SERVICE_ROLE = "the orchestrator service"


class HomeLock:
    """An exclusive, advisory lock on a home, released when the process exits."""

    def __init__(self, path: Path, role: str = "") -> None:
        self.path = path
        #: Written in the lock file, for the message another process gets ("the orchestrator service").
        self.role = role
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise HomeLockedError(
                f"orchestrator home {self.path.parent} is in use by {holder}; " + (
                    "the CLI and Orchestrator(home) go through it (service=False asks for the home itself); "
                    "or stop the service first" if holder.startswith(SERVICE_ROLE) else
                    "close that orchestrator (or talk to its service) first")
            ) from None
        os.ftruncate(fd, 0)
        who = f"{self.role}, " if self.role else ""
        os.pwrite(fd, f"{who}pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None


class Repository:
    """Stores jobs; see the module docstring for the read/write split."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: aiosqlite.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        #: One connection, one transaction at a time: a tick's flush must not
        #: BEGIN while a submission's add_subjobs transaction is still open.
        self._tx_lock = anyio.Lock()

    # ------------------------------------------------------------ life
    async def open(self) -> None:
        self._db = await sqlite.connect(self.path)
        await self._migrate()
        reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        reader.execute("PRAGMA query_only=1")
        self._reader = reader

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._db is not None:
            await self._db.close()
            self._db = None

    @property
    def db(self) -> aiosqlite.Connection:
        assert self._db is not None, "repository is not open"
        return self._db

    @property
    def reader(self) -> sqlite3.Connection:
        assert self._reader is not None, "repository is not open"
        return self._reader

    async def _migrate(self) -> None:
        """Bring the schema forward, one version per transaction."""
        version = await sqlite.checked_version(self.db, self.path, SCHEMA_VERSION)
        for target in range(version + 1, SCHEMA_VERSION + 1):
            async with sqlite.immediate(self.db):
                for statement in _MIGRATIONS[target]:
                    await self.db.execute(statement)
                await self.db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(target),))

    async def schema_version(self) -> int:
        return await sqlite.schema_version(self.db)

    # ------------------------------------------------------------ writes
    async def _transaction(self, statements: Iterable[tuple[str, Sequence[Any] | list[Sequence[Any]], bool]]) -> None:
        db = self.db
        async with self._tx_lock, sqlite.immediate(db):
            for sql, params, many in statements:
                if many:
                    await db.executemany(sql, params)
                else:
                    await db.execute(sql, params)

    async def next_id(self) -> int:
        async with self.db.execute("SELECT value FROM meta WHERE key='next_id'") as cur:
            row = await cur.fetchone()
        async with self.db.execute("SELECT COALESCE(MAX(id), -1) + 1 FROM jobs") as cur:
            top = await cur.fetchone()
        assert top is not None
        return max(int(row[0]) if row else 0, int(top[0]))

    async def add_job(self, row: JobRow) -> None:
        await self._transaction([
            ("INSERT INTO jobs (id, name, status, spec, backend_id, info, n_subjobs, master) "
             "VALUES (?, ?, ?, ?, ?, ?, 0, NULL)",
             (row.id, row.name, row.status, _dumps(row.spec), row.backend_id, _dumps(row.info)), False),
            ("INSERT OR REPLACE INTO meta VALUES ('next_id', ?)", (str(row.id + 1),), False),
        ])

    async def add_subjobs(self, master: JobRow, rows: Sequence[JobRow]) -> None:
        """All of a master's subjobs in one transaction, with the master's row."""
        params = [(r.id, r.idx, r.name, r.status, _dumps(r.spec), r.backend_id, _dumps(r.info)) for r in rows]
        await self._transaction([
            ("INSERT INTO subjobs (master, idx, name, status, spec, backend_id, info) "
             "VALUES (?, ?, ?, ?, ?, ?, ?)", params, True),
            *self._master_update([master]),
        ])

    async def remove_subjobs(self, master: JobRow) -> None:
        await self._transaction([
            ("DELETE FROM subjobs WHERE master = ?", (master.id,), False),
            ("DELETE FROM states WHERE job LIKE ?", (f"{master.id}.%",), False),
            *self._master_update([master]),
        ])

    async def remove_job(self, job_id: int) -> None:
        await self._transaction([
            ("DELETE FROM subjobs WHERE master = ?", (job_id,), False),
            ("DELETE FROM jobs WHERE id = ?", (job_id,), False),
            ("DELETE FROM states WHERE job = ? OR job LIKE ?", (str(job_id), f"{job_id}.%"), False),
        ])

    def _master_update(self, rows: Sequence[JobRow]) -> list[tuple[str, Any, bool]]:
        params = [(r.name, r.status, _dumps(r.spec), r.backend_id, _dumps(r.info), r.n_subjobs,
                   _dumps(r.master) if r.master is not None else None, r.id) for r in rows]
        return [("UPDATE jobs SET name=?, status=?, spec=?, backend_id=?, info=?, n_subjobs=?, master=? "
                 "WHERE id=?", params, True)]

    async def save(self, rows: Sequence[JobRow], states: Sequence[StateRow] = (), keep: int = 0) -> None:
        """Write many changed jobs and subjobs, and new states, in one transaction.

        Of each job's states only the newest ``keep`` stay (``keep=0``: all):
        the oldest is overwritten first.
        """
        top = [r for r in rows if r.idx is None]
        subs = [r for r in rows if r.idx is not None]
        with_spec = [(r.status, r.backend_id, _dumps(r.info), _dumps(r.spec), r.id, r.idx)
                     for r in subs if r.spec is not None]
        plain = [(r.status, r.backend_id, _dumps(r.info), r.id, r.idx) for r in subs if r.spec is None]
        statements = self._master_update(top) if top else []
        if with_spec:
            statements.append(("UPDATE subjobs SET status=?, backend_id=?, info=?, spec=? "
                               "WHERE master=? AND idx=?", with_spec, True))
        if plain:
            statements.append(("UPDATE subjobs SET status=?, backend_id=?, info=? WHERE master=? AND idx=?",
                               plain, True))
        if states:
            statements.append(("INSERT OR REPLACE INTO states (job, seq, time, final, data) VALUES (?, ?, ?, ?, ?)",
                               [(r.job, r.seq, r.time, int(r.final), r.data) for r in states], True))
            if keep > 0:
                jobs = sorted({r.job for r in states})
                statements.append(("DELETE FROM states WHERE job = ? AND seq <= "
                                   "(SELECT MAX(seq) FROM states WHERE job = ?) - ?",
                                   [(j, j, keep) for j in jobs], True))
        if statements:
            await self._transaction(statements)

    # ------------------------------------------------------------- reads
    async def load_toplevel(self) -> list[JobRow]:
        async with self.db.execute(
            "SELECT id, name, status, spec, backend_id, info, n_subjobs, master FROM jobs ORDER BY id"
        ) as cur:
            rows = await cur.fetchall()
        return [JobRow(r[0], None, r[1], r[2], json.loads(r[3]), r[4], json.loads(r[5]), r[6],
                       json.loads(r[7]) if r[7] else None) for r in rows]

    def load_statuses(self, master: int) -> bytearray:
        """Every subjob's status code, by index: the state machine's input."""
        codes = {s.value: s.code for s in JobStatus}
        cur = self.reader.execute("SELECT status FROM subjobs WHERE master=? ORDER BY idx", (master,))
        return bytearray(codes[s] for (s,) in cur)

    def load_subjobs(self, master: int, indexes: Sequence[int] | None = None) -> list[JobRow]:
        sql = "SELECT idx, name, status, spec, backend_id, info FROM subjobs WHERE master=?"
        if indexes is None:
            cur = self.reader.execute(sql + " ORDER BY idx", (master,))
            rows = cur.fetchall()
        else:
            rows = []
            for start in range(0, len(indexes), 900):
                chunk = list(indexes[start:start + 900])
                marks = ",".join("?" * len(chunk))
                rows += self.reader.execute(f"{sql} AND idx IN ({marks})", (master, *chunk)).fetchall()
        return [JobRow(master, r[0], r[1], r[2], json.loads(r[3]), r[4], json.loads(r[5])) for r in rows]

    def load_runs(self, master: int, indexes: Sequence[int]) -> list[tuple[int, str, str | None, dict[str, Any]]]:
        """(index, status, backend id, backend) of subjobs: what monitoring needs, without building jobs."""
        sql = "SELECT idx, status, backend_id, json_extract(spec, '$.backend') FROM subjobs WHERE master=? AND idx IN"
        rows = []
        for start in range(0, len(indexes), 900):
            chunk = list(indexes[start:start + 900])
            rows += self.reader.execute(f"{sql} ({','.join('?' * len(chunk))})", (master, *chunk)).fetchall()
        return [(r[0], r[1], r[2], json.loads(r[3])) for r in rows]

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
