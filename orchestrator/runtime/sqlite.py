"""What the core's SQLite files share: opening a writer, the schema version, a write transaction.

The job repository (``repository.sqlite``) and the workflow store
(``workflows.sqlite``) are separate files with their own schemas and their
own writers (:mod:`orchestrator.workflow.store` says why), but both are
opened, versioned and written the same way; this module is that way, once,
so that a fix to one (a pragma, the rollback path) reaches both.

A damaged file (SQLite's ``SQLITE_CORRUPT`` or ``SQLITE_NOTADB``) met while
opening or loading either becomes a :class:`~orchestrator.core.errors.RepositoryError`
that names the file, quotes SQLite, and says what to do (:func:`guarded`).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import anyio

from ..core.errors import RepositoryError

T = TypeVar("T")

META_TABLE = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


async def connect(path: Path, *, readonly: bool = False) -> aiosqlite.Connection:
    """A writer connection: autocommit (every transaction is an explicit :func:`immediate`), WAL, NORMAL sync.

    WAL lets readers go on while a transaction writes; WAL + NORMAL survives a killed process; the busy
    timeout makes a BEGIN wait for another connection's lock rather than fail at once. ``readonly``: a
    reader of a home another process holds (SQLite opens it ``mode=ro``; the writer's WAL is read as is).
    """
    # Shielded: a connect cancelled half-way would leave its thread holding a connection nobody closes.
    with anyio.CancelScope(shield=True):
        if readonly:
            db = await aiosqlite.connect(_uri(path), uri=True, isolation_level=None)
        else:
            db = await aiosqlite.connect(path, isolation_level=None)
    try:
        if not readonly:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute("PRAGMA synchronous=NORMAL")
        await db.execute("PRAGMA busy_timeout=10000")
    except BaseException:
        await close(db)
        raise
    return db


class Connected:
    """What owns one writer connection: ``db`` while open (an assertion naming ``what`` otherwise), and a
    shielded close (:func:`close`)."""

    _db: aiosqlite.Connection | None = None
    #: What the owner is, for the assertion's message.
    what = "the database"

    @property
    def db(self) -> aiosqlite.Connection:
        assert self._db is not None, f"{self.what} is not open"
        return self._db

    async def close(self) -> None:
        db, self._db = self._db, None
        await close(db)


async def close(db: aiosqlite.Connection | None) -> None:
    """Close ``db`` (if any), shielded: closed as the service stops (a cancellation), the connection's thread
    must still end before the loop does, or it calls back into a closed loop."""
    if db is not None:
        with anyio.CancelScope(shield=True):
            await db.close()


def _uri(path: Path) -> str:
    """A read-only connection's URI (immutable on read-only media: nothing may create the WAL's index there)."""
    frozen = "&immutable=1" if on_read_only_media(path.parent) else ""
    return f"{path.resolve().as_uri()}?mode=ro{frozen}"


def reader(path: Path, *, readonly: bool) -> sqlite3.Connection:
    """The blocking connection for small reads on the loop's thread; never writes (``query_only``)."""
    if readonly:
        conn = sqlite3.connect(_uri(path), uri=True, isolation_level=None, check_same_thread=False)
    else:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA query_only=1")
    return conn


def on_read_only_media(path: Path) -> bool:
    """Whether ``path`` lies on a file system mounted read-only (a snapshot, a read-only bind mount, a CD)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


async def schema_version(db: aiosqlite.Connection) -> int:
    """The schema version recorded in the ``meta`` table (0: none yet)."""
    async with db.execute("SELECT value FROM meta WHERE key='schema_version'") as cur:
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def checked_version(db: aiosqlite.Connection, path: Path, supported: int, *, readonly: bool = False) -> int:
    """The file's schema version, ``meta`` created if missing; a version above ``supported`` refuses.

    A newer file was written by a later release whose changes this code cannot know: reading or
    migrating it would be guesswork, so the user is told to upgrade instead.
    """
    if not readonly:
        await db.execute(META_TABLE)
    version = await schema_version(db)
    if version > supported:
        raise RepositoryError(f"{path} has schema version {version}, newer than this orchestrator's "
                              f"{supported}: upgrade the orchestrator", path=str(path))
    return version


#: SQLite's primary result codes for a file that is not (or no longer) a database.
DAMAGED = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


def is_damaged(exc: BaseException) -> bool:
    """Whether SQLite said the file is damaged (an extended code's low byte is its primary code)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.DatabaseError) and isinstance(code, int) and code & 0xFF in DAMAGED


#: SQLite's primary result codes for values it will not store: a constraint (a trigger's ``RAISE``), a string or
#: blob too big, a type or a parameter it cannot take, and its generic error (``malformed JSON``, as its JSON
#: functions say of NaN). The same rows are refused again at every try. Every other code is the file's or the
#: machine's (busy, locked, full, read-only, an I/O error, damaged): the same rows may go in later.
REFUSALS = {sqlite3.SQLITE_ERROR, sqlite3.SQLITE_TOOBIG, sqlite3.SQLITE_CONSTRAINT, sqlite3.SQLITE_MISMATCH,
            sqlite3.SQLITE_RANGE}


def refuses(exc: BaseException) -> bool:
    """Whether a write failed on the values written, not on the file (:data:`REFUSALS`). A value that cannot
    be bound fails before SQLite sees it: ``UnicodeError`` (a lone surrogate), ``OverflowError`` (an integer
    past 64 bits). Not a ``ValueError`` or a ``ProgrammingError`` as such: aiosqlite and sqlite3 say so of a
    connection that is closed."""
    if isinstance(exc, (UnicodeError, OverflowError, sqlite3.DataError, sqlite3.IntegrityError)):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.DatabaseError) and isinstance(code, int) and code & 0xFF in REFUSALS


def damaged(path: Path, exc: BaseException) -> RepositoryError:
    """The error a user reads: which file, what SQLite said, what to do."""
    return RepositoryError(
        f"{path} is damaged: SQLite says \"{exc}\". Nothing was changed. Restore it from a backup made with "
        f"'orchestrator backup' (copy the backup's {path.name} over it while no orchestrator uses the home), or "
        f"move it aside to start with an empty one; 'sqlite3 {path} .recover' may save what is still readable.",
        path=str(path))


@contextmanager
def guarded(path: Path) -> Iterator[None]:
    """Around opening or reading ``path``: a damaged file raises :func:`damaged`'s error, anything else as is."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if is_damaged(exc):
            raise damaged(path, exc) from exc
        raise


@asynccontextmanager
async def immediate(db: aiosqlite.Connection) -> AsyncIterator[None]:
    """One write transaction around the ``async with`` body: committed if it ends, rolled back if it raises.

    ``BEGIN IMMEDIATE`` takes the write lock at the start, so a busy file makes the BEGIN wait (busy
    timeout) instead of a statement half-way through failing. Whatever the body raises, cancellation
    included, is re-raised after the rollback: a change is written whole or not at all.

    Cancellation does not stop SQLite: a ``BEGIN`` cancelled while it waits for the lock still runs in
    the connection's thread, and opens a transaction once the lock comes free. So the COMMIT and every
    rollback are shielded, and a BEGIN that did not return is followed (shielded) by a rollback of
    whatever transaction it left open; the connection's next transaction then starts clean.
    """
    try:
        await db.execute("BEGIN IMMEDIATE")
    except BaseException as exc:
        await _abandon(db, exc)
        raise
    try:
        yield
        with anyio.CancelScope(shield=True):
            await db.execute("COMMIT")
    except BaseException as exc:
        await _abandon(db, exc)
        raise


async def _abandon(db: aiosqlite.Connection, exc: BaseException) -> None:
    """Roll back the connection's open transaction, if any, whatever cancels the caller meanwhile.

    The ``SELECT 1`` queues behind a statement that may still be running in the connection's thread
    (a cancelled BEGIN waiting for the lock), so ``in_transaction`` is read once that has ended. SQLite
    may have rolled back already (a failed COMMIT, a full disk): then there is nothing to do. A rollback
    that fails is noted on ``exc``, which is the error the caller sees.
    """
    with anyio.CancelScope(shield=True):
        try:
            await db.execute("SELECT 1")
            if db.in_transaction:
                await db.execute("ROLLBACK")
        except Exception as failed:  # the original error is the one to report
            exc.add_note(f"and the rollback failed: {failed!r}")


async def in_thread(db: aiosqlite.Connection, work: Callable[..., T], *args: Any) -> T:
    """``work(connection, *args)`` in ``db``'s own thread, on its ``sqlite3`` connection: for what aiosqlite has
    no call for (incremental blob I/O). aiosqlite runs every call of a connection in that one thread, and a
    ``sqlite3`` connection may be used only there; its ``_execute`` is the door its own calls go through (the one
    place this package uses aiosqlite's inside; a new aiosqlite without it fails the repository's tests)."""
    done: T = await db._execute(lambda: work(db._conn, *args))  # type: ignore[no-untyped-call]
    return done
