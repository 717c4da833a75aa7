"""What the core's SQLite files share: opening a writer, the schema version, a write transaction.

The job repository (``repository.sqlite``) and the workflow store
(``workflows.sqlite``) are separate files with their own schemas and their
own writers (:mod:`orchestrator.workflow.store` says why), but both are
opened, versioned and written the same way; this module is that way, once,
so that a fix to one (a pragma, the rollback path) reaches both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiosqlite

META_TABLE = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


async def connect(path: Path) -> aiosqlite.Connection:
    """A writer connection: autocommit (every transaction is an explicit :func:`immediate`), WAL, NORMAL sync.

    WAL lets readers go on while a transaction writes; WAL + NORMAL survives a killed process; the busy
    timeout makes a BEGIN wait for another connection's lock rather than fail at once.
    """
    db = await aiosqlite.connect(path, isolation_level=None)
    try:
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute("PRAGMA synchronous=NORMAL")
        await db.execute("PRAGMA busy_timeout=10000")
    except BaseException:
        await db.close()
        raise
    return db


async def schema_version(db: aiosqlite.Connection) -> int:
    """The schema version recorded in the ``meta`` table (0: none yet)."""
    async with db.execute("SELECT value FROM meta WHERE key='schema_version'") as cur:
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def checked_version(db: aiosqlite.Connection, path: Path, supported: int) -> int:
    """The file's schema version, ``meta`` created if missing; a version above ``supported`` refuses.

    A newer file was written by a later release whose changes this code cannot know: reading or
    migrating it would be guesswork, so the user is told to upgrade instead.
    """
    await db.execute(META_TABLE)
    version = await schema_version(db)
    if version > supported:
        raise RuntimeError(f"{path} has schema version {version}, newer than this orchestrator's "
                           f"{supported}: upgrade the orchestrator")
    return version


@asynccontextmanager
async def immediate(db: aiosqlite.Connection) -> AsyncIterator[None]:
    """One write transaction around the ``async with`` body: committed if it ends, rolled back if it raises.

    ``BEGIN IMMEDIATE`` takes the write lock at the start, so a busy file makes the BEGIN wait (busy
    timeout) instead of a statement half-way through failing. Whatever the body raises, cancellation
    included, is re-raised after the rollback: a change is written whole or not at all.
    """
    await db.execute("BEGIN IMMEDIATE")
    try:
        yield
        await db.execute("COMMIT")
    except BaseException:
        await db.execute("ROLLBACK")
        raise
