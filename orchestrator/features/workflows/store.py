"""Workflow persistence: ``<home>/workflows.sqlite`` (aiosqlite, WAL), apart from the job repository.

Why a file of its own rather than tables in ``repository.sqlite``: the
repository's schema is the core's, versioned and migrated forward by the
core's own code (a newer schema version refuses to open), and the core
writes it in batched transactions from its flush loop. Tables added there
from outside would be invisible to those migrations, and a second writer
connection would contend with the flushes for SQLite's single write lock.
A separate file has its own schema version, its own writer, and costs the
core nothing; the home's lock already makes one process its only user.

What is stored: each workflow's normalized definition (the dict/TOML form)
and its state (hold, dropped files, files deleted or evicted), and per
package the id of its orchestrator job and its flags. The jobs themselves,
statuses, retries and histories, stay in the repository: on reopen the core
restores them and the runner finds them again by id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite
import anyio

from ...runtime import sqlite

SCHEMA_VERSION = 1
_SCHEMA = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE workflows (
        id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL UNIQUE,
        spec TEXT NOT NULL,
        state TEXT NOT NULL
    )""",
    """CREATE TABLE packages (
        workflow TEXT NOT NULL,
        key TEXT NOT NULL,
        job_id INTEGER,
        state TEXT NOT NULL,
        PRIMARY KEY (workflow, key)
    ) WITHOUT ROWID""",
]


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass
class StoredPackage:
    job_id: int | None = None
    state: dict[str, Any] = field(default_factory=dict)


@dataclass
class StoredWorkflow:
    id: str
    seq: int
    spec: dict[str, Any]
    state: dict[str, Any]
    packages: dict[str, StoredPackage]


class WorkflowStore(sqlite.Connected):
    """One connection; every write is one short transaction."""

    what = "the workflow store"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: aiosqlite.Connection | None = None
        self._lock = anyio.Lock()

    async def open(self) -> None:
        """Open (and create) the file; a damaged one raises :class:`~orchestrator.core.errors.RepositoryError`."""
        with sqlite.guarded(self.path):
            db = self._db = await sqlite.connect(self.path)
            try:
                await self._migrate()
            except BaseException:
                self._db = None
                with anyio.CancelScope(shield=True):
                    await db.close()
                raise

    async def _migrate(self) -> None:
        if await sqlite.checked_version(self.db, self.path, SCHEMA_VERSION) < 1:
            await self._transaction([(sql, ()) for sql in _SCHEMA]
                                    + [("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", ("1",))])

    async def _transaction(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        async with self._lock:
            with anyio.CancelScope(shield=True):  # a half-written change is worse than a late close
                async with sqlite.immediate(self.db):
                    for sql, params in statements:
                        await self.db.execute(sql, params)

    # ------------------------------------------------------------ writes
    async def add(self, wf_id: str, spec: dict[str, Any], state: dict[str, Any],
                  packages: dict[str, StoredPackage]) -> int:
        """Store a new workflow and its packages in one transaction; returns its sequence number."""
        async with self.db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM workflows") as cur:
            row = await cur.fetchone()
        seq = int(row[0]) if row else 1
        await self._transaction([("INSERT INTO workflows (id, seq, spec, state) VALUES (?, ?, ?, ?)",
                                  (wf_id, seq, _dumps(spec), _dumps(state))), *self._package_rows(wf_id, packages)])
        return seq

    async def save_state(self, wf_id: str, state: dict[str, Any]) -> None:
        await self._transaction([("UPDATE workflows SET state=? WHERE id=?", (_dumps(state), wf_id))])

    async def save_packages(self, wf_id: str, packages: dict[str, StoredPackage]) -> None:
        await self._transaction(self._package_rows(wf_id, packages))

    @staticmethod
    def _package_rows(wf_id: str, packages: dict[str, StoredPackage]) -> list[tuple[str, tuple[Any, ...]]]:
        return [("INSERT OR REPLACE INTO packages (workflow, key, job_id, state) VALUES (?, ?, ?, ?)",
                 (wf_id, key, p.job_id, _dumps(p.state))) for key, p in packages.items()]

    # ------------------------------------------------------------- reads
    async def ids(self) -> list[str]:
        async with self.db.execute("SELECT id FROM workflows ORDER BY seq") as cur:
            return [r[0] for r in await cur.fetchall()]

    async def load(self) -> list[StoredWorkflow]:
        with sqlite.guarded(self.path):
            return await self._load()

    async def _load(self) -> list[StoredWorkflow]:
        async with self.db.execute("SELECT id, seq, spec, state FROM workflows ORDER BY seq") as cur:
            rows = await cur.fetchall()
        out = {r[0]: StoredWorkflow(r[0], r[1], json.loads(r[2]), json.loads(r[3]), {}) for r in rows}
        async with self.db.execute("SELECT workflow, key, job_id, state FROM packages") as cur:
            for wf_id, key, job_id, state in await cur.fetchall():
                if wf_id in out:
                    out[wf_id].packages[key] = StoredPackage(job_id, json.loads(state))
        return list(out.values())
