"""The PostgreSQL repository (asyncpg): the rows of :mod:`..repository`, in a database several homes may share.

Three connections. The writer's, on the main loop: every write is one
transaction that first shows the lease's fencing token (the database
refuses it otherwise, :mod:`.schema`); a master's subjobs go in with
``COPY``, the per-subjob columns a tick changed with one ``UPDATE ... FROM
unnest(...)`` each, so a flush is a handful of statements whatever its
size. Two on a side loop (:mod:`.side`): the synchronous look-ups, and the
lease (:mod:`.lease`), taken at open and renewed there every fifth of
``lease_seconds``.

Losing the lease (another process took it over, or its renewal cannot reach
the database) sets :meth:`lost`; from then on every write is refused by the
database, and :meth:`confirm_writer` raises, so the runtime sends nothing
more to the backends. Between renewals, ``confirm_writer`` lets a run go to
a backend only while the last renewal is younger than half the lease: a
process frozen longer than that asks the database again first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import asyncpg

from ...core.errors import RepositoryError, RepositoryHeldError
from ...core.ids import as_range
from ...core.splitters import DEFERRED, is_deferred
from ...plugin.logs import get_logger
from ..repository import TIME_KINDS, Loaded, RunsRow, Save, StateRow, TopRow, closed, dumps, shown_url
from . import schema
from .connect import connect, holder_settings, unreachable
from .lease import Lease, LeaseView
from .side import SideLoop

S = schema.SCHEMA
#: Seconds a synchronous look-up may take before it is an error.
LOOKUP_TIMEOUT = 60.0
#: Seconds closing a connection (and giving the lease back) may take: a database gone away is not waited for.
CLOSE_TIMEOUT = 5.0
_RUNS_UPSERT = (f"INSERT INTO {S}.runs VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (job) DO UPDATE SET "
                "status = EXCLUDED.status, attempt = EXCLUDED.attempt, t_submitting = EXCLUDED.t_submitting, "
                "t_submitted = EXCLUDED.t_submitted, t_running = EXCLUDED.t_running, t_final = EXCLUDED.t_final")


def _unnest_update(column: str, kind: str) -> str:
    """One statement that sets ``column`` of many subjob rows: arrays of masters, indexes and values."""
    return (f"UPDATE {S}.subjobs AS s SET {column} = v.value FROM unnest($1::bigint[], $2::int[], $3::{kind}[]) "
            "AS v(master, idx, value) WHERE s.master = v.master AND s.idx = v.idx")


#: SQLSTATE classes of values PostgreSQL will not store: a data exception (a NUL in ``text``, a number out of
#: range), an integrity constraint, an exception a trigger raised (PL/pgSQL), a limit exceeded (a row too big).
#: Every other class is the server's or the connection's (unreachable, shutting down, out of resources, a
#: serialization failure, a privilege revoked): the same rows may go in later.
REFUSALS = ("22", "23", "P0", "54")


def refuses(exc: BaseException) -> bool:
    """Whether a write failed on the values written (:data:`REFUSALS`); or before they reached the server: one
    asyncpg cannot encode (its client-side ``DataError``: "invalid input for query argument"; a lone
    surrogate's ``UnicodeError``)."""
    if isinstance(exc, (UnicodeError, OverflowError)) or (isinstance(exc, asyncpg.InterfaceError)
                                                          and isinstance(exc, ValueError)):  # (that DataError)
        return True
    return isinstance(exc, asyncpg.PostgresError) and str(exc.sqlstate or "")[:2] in REFUSALS


def split_spec(spec: Mapping[str, Any]) -> tuple[str, str | None]:
    """A definition as stored: its text with the splitter's parameters left out, and the splitter's text
    (``None``: none, or a deferred one, which leaves the stored splitter as it is)."""
    splitter = spec.get("splitter")
    if not isinstance(splitter, dict) or is_deferred(splitter):
        return dumps(spec), None
    return dumps({**spec, "splitter": {"plugin": splitter.get("plugin"), DEFERRED: True}}), dumps(splitter)


def held_message(where: str, view: LeaseView) -> str:
    return (f"the repository {where} is in use by {view.describe()}; the CLI and Orchestrator(home) go through "
            "that service when it published where it answers, or stop it first")


class PgRepository:
    """See the module docstring. ``holder`` describes this process in the lease (who holds it, where)."""

    def __init__(self, url: str, *, holder: str, lease_seconds: float = 5.0) -> None:
        self.url = url
        self.where = shown_url(url)
        self.holder = holder
        self.lease_seconds = lease_seconds
        self._db: asyncpg.Connection | None = None
        self._side: SideLoop | None = None
        self._reader: asyncpg.Connection | None = None
        self._lease: Lease | None = None
        self._keeper: asyncio.Future[None] | None = None
        self._readonly = False
        self._tx_lock = anyio.Lock()
        #: Set (from the side loop, through the main loop) when the lease is lost; made at open, on the main loop.
        self._lost: anyio.Event | None = None
        self._lost_flag = False
        self._lost_why = ""
        #: Side-loop locks: one statement at a time on the lease's connection, and on the reader's.
        self._side_lock = asyncio.Lock()
        self._reader_lock = asyncio.Lock()
        self._main: asyncio.AbstractEventLoop | None = None
        #: ``time.monotonic()`` when the newest successful renewal (or the taking) was sent.
        self._confirmed = 0.0

    # ------------------------------------------------------------ life
    async def _connect(self) -> asyncpg.Connection:
        return await connect(self.url, holder_settings(self.lease_seconds))

    async def open(self, *, readonly: bool = False) -> None:
        """Connect, make or check the schema, take the lease (unless ``readonly``), migrate forward."""
        self._readonly = readonly
        self._main = asyncio.get_running_loop()
        self._lost = anyio.Event()
        self._side = SideLoop("orchestrator-repository")
        try:
            with unreachable(self.where):
                self._db = await self._connect()
                self._reader = await self._side.run(self._connect())
                found = await schema.version(self._db) if readonly else await schema.create(self._db)
            if found is None:
                raise RepositoryError(f"{self.where} holds no orchestrator repository (yet): nothing to read",
                                      path=self.where)
            if found > schema.VERSION:
                raise RepositoryError(f"{self.where} has schema version {found}, newer than this orchestrator's "
                                      f"{schema.VERSION}: upgrade the orchestrator", path=self.where)
            if readonly:
                if found < schema.VERSION:
                    raise RepositoryError(f"{self.where} has schema version {found}, older than this "
                                          f"orchestrator's {schema.VERSION}: read it once its writer migrated it",
                                          path=self.where)
                return
            await self._side.run(self._take())
            if found < schema.VERSION:
                async with self._fenced():
                    await schema.migrate(self.db, found)
        except BaseException:
            await self.close()
            raise

    async def _take(self) -> None:
        """(side loop) Take the lease on a connection of its own, and keep it renewed from there."""
        with unreachable(self.where):
            conn = await self._connect()
        lease = Lease(conn, self.holder, self.lease_seconds)
        sent = time.monotonic()
        try:
            with unreachable(self.where):
                view = await lease.take()
        except BaseException:
            await conn.close()
            raise
        if lease.ended:
            get_logger(component="repository").warning(
                "ended the sessions of the lease's expired holder, frozen or cut off inside a transaction",
                repository=self.where, sessions=lease.ended)
        if view is not None:
            await conn.close()
            raise RepositoryHeldError(held_message(self.where, view), view.address)
        self._lease, self._confirmed = lease, sent
        self._keeper = asyncio.ensure_future(self._keep(lease))

    async def _keep(self, lease: Lease) -> None:
        """(side loop) Renew every fifth of the lease; a renewal refused or failed: the lease is lost."""
        while True:
            await asyncio.sleep(self.lease_seconds / 5)
            await self._renew(lease)

    async def _renew(self, lease: Lease) -> None:
        sent = time.monotonic()
        why = "another orchestrator took its lease over"
        try:
            async with self._side_lock:
                kept = await lease.renew()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            kept, why = False, f"its lease could not be renewed ({type(exc).__name__}: {exc})"
        if kept:
            self._confirmed = max(self._confirmed, sent)
        elif not self._lost_flag:
            self._lost_flag = True
            self._lost_why = why
            if self._main is not None and self._lost is not None and not self._main.is_closed():
                self._main.call_soon_threadsafe(self._lost.set)

    async def close(self) -> None:
        """Give the lease back (a standby takes over at once) and close every connection."""
        with anyio.CancelScope(shield=True):
            side, self._side = self._side, None
            if side is not None:
                await side.run(self._let_go())
                side.stop()
            if self._db is not None:
                db, self._db = self._db, None
                await _close(db)

    async def _let_go(self) -> None:
        """(side loop) Stop renewing, release the lease unless it was lost, close the side connections."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        lease, self._lease = self._lease, None
        if lease is not None:
            try:
                if not self._lost_flag:
                    async with self._side_lock:
                        await asyncio.wait_for(lease.release(), CLOSE_TIMEOUT)
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
                pass  # the lease then expires by itself
            await _close(lease.conn)
        if self._reader is not None:
            reader, self._reader = self._reader, None
            await _close(reader)

    @property
    def db(self) -> asyncpg.Connection:
        assert self._db is not None, "repository is not open"
        return self._db

    async def schema_version(self) -> int:
        return await schema.version(self.db) or 0

    async def home_key(self) -> str:
        """Made with the schema, the same for every home on the database."""
        return str(await self.db.fetchval(f"SELECT value FROM {S}.meta WHERE key = 'home_key'"))

    # ------------------------------------------------------------ the writer's standing: the lease
    def _refused(self) -> RepositoryHeldError:
        return RepositoryHeldError(f"this orchestrator may no longer write to the repository {self.where}: "
                                   f"{self._lost_why or 'it holds no lease'}")

    async def confirm_writer(self) -> None:
        if self._lost_flag or self._lease is None:
            raise self._refused()
        if time.monotonic() - self._confirmed < self.lease_seconds / 2:
            return
        assert self._side is not None
        await self._side.run(self._renew(self._lease))
        if self._lost_flag:
            raise self._refused()

    async def lost(self) -> str:
        assert self._lost is not None, "repository is not open"
        await self._lost.wait()
        return self._lost_why

    async def announce(self, address: Mapping[str, Any]) -> None:
        if self._lease is not None and self._side is not None:
            await self._side.run(self._publish(self._lease, dict(address)))

    async def _publish(self, lease: Lease, address: dict[str, Any]) -> None:
        async with self._side_lock:
            await lease.publish(address)

    # ------------------------------------------------------------ writes
    @asynccontextmanager
    async def _fenced(self) -> AsyncIterator[None]:
        """One write transaction that shows the fencing token; refused (and rolled back whole) without it."""
        if self._readonly:
            raise RepositoryError(f"{self.where} is open to read only", path=self.where)
        token = self._lease.token if self._lease is not None else None
        try:
            async with self.db.transaction():
                await self.db.execute("SELECT set_config($1, $2, true)", schema.FENCE_SETTING, str(token or ""))
                yield
        except asyncpg.PostgresError as exc:
            if getattr(exc, "sqlstate", None) == schema.FENCED:
                raise RepositoryHeldError(f"the repository {self.where} refused this write: "
                                          f"{exc.args[0] if exc.args else exc} (another orchestrator took it "
                                          "over; this one writes nothing more)") from exc
            raise

    async def _transaction(self, steps: Iterable[Callable[[], Awaitable[Any]]]) -> None:
        with anyio.CancelScope(shield=True):  # written whole or not at all, whatever cancels the caller
            async with self._tx_lock, self._fenced():
                for step in steps:
                    await step()

    def _run(self, sql: str, *args: Any) -> Callable[[], Awaitable[Any]]:
        return lambda: self.db.execute(sql, *args)

    def _many(self, sql: str, rows: Sequence[Sequence[Any]]) -> Callable[[], Awaitable[Any]]:
        return lambda: self.db.executemany(sql, rows)

    async def next_id(self) -> int:
        stored = await self.db.fetchval(f"SELECT value FROM {S}.meta WHERE key = 'next_id'")
        top = await self.db.fetchval(f"SELECT COALESCE(MAX(id), -1) + 1 FROM {S}.jobs")
        return max(int(stored) if stored is not None else 0, int(top))

    async def add_job(self, row: TopRow, runs: RunsRow) -> None:
        spec, splitter = split_spec(row.spec or {})
        await self._transaction([
            self._run(f"INSERT INTO {S}.jobs (id, name, status, spec, splitter, backend_id, info, n_subjobs, added) "
                      "VALUES ($1, $2, $3, $4, $5, $6, $7, 0, $8)",
                      row.id, row.name, row.status, spec, splitter, row.backend_id, dumps(row.info), row.added),
            self._run(_RUNS_UPSERT, *runs.values()),
            self._run(f"INSERT INTO {S}.meta VALUES ('next_id', $1) ON CONFLICT (key) DO UPDATE SET value = $1",
                      str(row.id + 1)),
        ])

    async def store_split(self, master: TopRow, runs: RunsRow, deltas: Iterable[str | None]) -> None:
        job = master.id
        records = [(job, i, d) for i, d in enumerate(deltas)]

        async def copy() -> None:
            await self.db.copy_records_to_table("subjobs", schema_name=S, columns=["master", "idx", "delta"],
                                                records=records)

        await self._transaction([copy, self._run(_RUNS_UPSERT, *runs.values()), *self._top_update([master])])

    async def remove_split(self, master: TopRow, runs: RunsRow) -> None:
        await self._transaction([
            self._run(f"DELETE FROM {S}.subjobs WHERE master = $1", master.id),
            self._run(f"DELETE FROM {S}.states WHERE job LIKE $1", f"{master.id}.%"),
            self._run(_RUNS_UPSERT, *runs.values()),
            *self._top_update([master]),
        ])

    async def remove_job(self, job_id: int) -> None:
        await self._transaction([
            self._run(f"DELETE FROM {S}.subjobs WHERE master = $1", job_id),
            self._run(f"DELETE FROM {S}.runs WHERE job = $1", job_id),
            self._run(f"DELETE FROM {S}.jobs WHERE id = $1", job_id),
            self._run(f"DELETE FROM {S}.states WHERE job = $1 OR job LIKE $2", str(job_id), f"{job_id}.%"),
        ])

    def _top_update(self, rows: Sequence[TopRow]) -> list[Callable[[], Awaitable[Any]]]:
        """A top-level row's state; a new definition with its splitter in full replaces the stored splitter."""
        full, kept, plain = [], [], []
        for r in rows:
            if r.spec is None:
                plain.append((r.name, r.status, dumps(r.info), r.n_subjobs, r.id))
                continue
            spec, splitter = split_spec(r.spec)
            if splitter is None and is_deferred(r.spec.get("splitter")):
                kept.append((r.name, r.status, spec, dumps(r.info), r.n_subjobs, r.id))
            else:
                full.append((r.name, r.status, spec, splitter, dumps(r.info), r.n_subjobs, r.id))
        out = []
        if full:
            out.append(self._many(f"UPDATE {S}.jobs SET name=$1, status=$2, spec=$3, splitter=$4, info=$5, "
                                  "n_subjobs=$6 WHERE id=$7", full))
        if kept:
            out.append(self._many(f"UPDATE {S}.jobs SET name=$1, status=$2, spec=$3, info=$4, n_subjobs=$5 "
                                  "WHERE id=$6", kept))
        if plain:
            out.append(self._many(f"UPDATE {S}.jobs SET name=$1, status=$2, info=$3, n_subjobs=$4 WHERE id=$5",
                                  plain))
        return out

    async def save(self, batch: Save) -> None:
        steps = self._top_update(batch.tops)
        if batch.runs:
            steps.append(self._many(_RUNS_UPSERT, [r.values() for r in batch.runs]))
        for column, rows in (("info", [(m, i, v) for m, i, v in batch.infos]),
                             ("backend_id", [(m, i, b) for m, i, b in batch.backend_ids if i is not None]),
                             ("delta", [(m, i, d) for m, i, d in batch.deltas])):
            if rows:
                masters, indexes, values = (list(c) for c in zip(*rows, strict=True))
                steps.append(self._run(_unnest_update(column, "text"), masters, indexes, values))
        tops = [(b, m) for m, i, b in batch.backend_ids if i is None]
        if tops:
            steps.append(self._many(f"UPDATE {S}.jobs SET backend_id=$1 WHERE id=$2", tops))
        if batch.states:
            steps.append(self._many(
                f"INSERT INTO {S}.states (job, seq, time, final, data) VALUES ($1, $2, $3, $4, $5) "
                "ON CONFLICT (job, seq) DO UPDATE SET time = EXCLUDED.time, final = EXCLUDED.final, "
                "data = EXCLUDED.data", [(r.job, r.seq, r.time, r.final, r.data) for r in batch.states]))
            if batch.keep > 0:
                steps.append(self._run(
                    f"DELETE FROM {S}.states AS s USING (SELECT job, MAX(seq) AS newest FROM {S}.states "
                    "WHERE job = ANY($1::text[]) GROUP BY job) AS n WHERE s.job = n.job AND s.seq <= n.newest - $2",
                    sorted({r.job for r in batch.states}), batch.keep))
        if steps:
            await self._transaction(steps)

    def refuses(self, error: BaseException) -> bool:
        return refuses(error)

    # ------------------------------------------------------------- reads
    async def load(self) -> Loaded:
        rows = await self.db.fetch(f"SELECT id, name, status, spec, backend_id, info, n_subjobs, added "
                                   f"FROM {S}.jobs ORDER BY id")
        tops = [TopRow(r[0], r[1], r[2], json.loads(r[3]), r[4], json.loads(r[5]), r[6], r[7]) for r in rows]
        runs = {r[0]: RunsRow(r[0], r[1], r[2], {k: r[3 + n] for n, k in enumerate(TIME_KINDS)})
                for r in await self.db.fetch(f"SELECT job, status, attempt, t_submitting, t_submitted, t_running, "
                                             f"t_final FROM {S}.runs")}
        infos: dict[int, dict[int, dict[str, Any]]] = {}
        for master, idx, info in await self.db.fetch(f"SELECT master, idx, info FROM {S}.subjobs "
                                                     "WHERE info IS NOT NULL"):
            infos.setdefault(master, {})[idx] = json.loads(info)
        return Loaded(tops, runs, infos)

    def _lookup(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        """A synchronous read, on the side loop's connection (see :mod:`.side`)."""
        if self._side is None or self._reader is None:
            raise closed(self.where)
        try:
            return self._side.call(self._fetch(self._reader, sql, *args), LOOKUP_TIMEOUT)
        except TimeoutError as exc:
            raise RepositoryError(f"{self.where} did not answer a look-up within {LOOKUP_TIMEOUT:g} s",
                                  path=self.where) from exc

    async def _fetch(self, conn: asyncpg.Connection, sql: str, *args: Any) -> list[asyncpg.Record]:
        """(side loop) One look-up at a time on the reader (a postprocessor's thread may look up too)."""
        async with self._reader_lock:
            return await conn.fetch(sql, *args)

    def subjob_rows(self, master: int, indexes: Sequence[int]) -> dict[int, tuple[str | None, str | None]]:
        if len(indexes) > 900 and as_range(indexes) is not None:  # a run of consecutive ones: one range
            rows = self._lookup(f"SELECT idx, backend_id, delta FROM {S}.subjobs WHERE master = $1 AND idx >= $2 "
                                "AND idx <= $3", master, indexes[0], indexes[-1])
            return {r[0]: (r[1], r[2]) for r in rows}
        rows = self._lookup(f"SELECT idx, backend_id, delta FROM {S}.subjobs WHERE master = $1 AND idx = ANY($2)",
                            master, list(indexes))
        return {r[0]: (r[1], r[2]) for r in rows}

    def all_deltas(self, master: int, *, start: int = 0, stop: int | None = None) -> list[str | None]:
        if start == 0 and stop is None:
            return [r[0] for r in self._lookup(f"SELECT delta FROM {S}.subjobs WHERE master = $1 ORDER BY idx",
                                               master)]
        return [r[0] for r in self._lookup(f"SELECT delta FROM {S}.subjobs WHERE master = $1 AND idx >= $2 "
                                           "AND idx < $3 ORDER BY idx", master, start, 2**62 if stop is None else stop)]

    def stored_splitter(self, job: int) -> dict[str, Any] | None:
        rows = self._lookup(f"SELECT splitter FROM {S}.jobs WHERE id = $1", job)
        return json.loads(rows[0][0]) if rows and rows[0][0] else None

    def top_backend_id(self, job: int) -> str | None:
        rows = self._lookup(f"SELECT backend_id FROM {S}.jobs WHERE id = $1", job)
        return rows[0][0] if rows else None

    async def states(self, job: str) -> list[StateRow]:
        rows = await self.db.fetch(f"SELECT job, seq, time, final, data FROM {S}.states WHERE job = $1 ORDER BY seq",
                                   job)
        return [StateRow(r[0], r[1], r[2], r[3], r[4]) for r in rows]

    async def state(self, job: str, seq: int | None = None) -> StateRow | None:
        if seq is None:
            r = await self.db.fetchrow(f"SELECT job, seq, time, final, data FROM {S}.states WHERE job = $1 "
                                       "ORDER BY seq DESC LIMIT 1", job)
        else:
            r = await self.db.fetchrow(f"SELECT job, seq, time, final, data FROM {S}.states WHERE job = $1 "
                                       "AND seq = $2", job, seq)
        return StateRow(r[0], r[1], r[2], r[3], r[4]) if r else None


async def _close(conn: asyncpg.Connection) -> None:
    """Close politely within :data:`CLOSE_TIMEOUT`, else drop the connection."""
    try:
        await conn.close(timeout=CLOSE_TIMEOUT)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        conn.terminate()
