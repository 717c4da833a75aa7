"""Reaching a PostgreSQL repository: connecting, and looking at its lease from outside (clients, a standby).

A client of a shared repository asks :func:`read_lease` who writes it and
where that service answers. A standby keeps a :class:`LeaseWatch`: one
connection of its own, on which it looks every half second whether the
lease is free (released, expired, or its holder's session gone); a
connection that breaks is made again at the next look, and the error is
what the look returns meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg

from ...core.errors import RepositoryError
from ..repository import shown_url
from . import schema
from .lease import LeaseView, inspect

#: Seconds connecting may take.
CONNECT_TIMEOUT = 10.0


async def connect(url: str, settings: dict[str, str] | None = None) -> asyncpg.Connection:
    """A connection named ``orchestrator`` in ``pg_stat_activity``; ``settings``: more of the session's settings."""
    return await asyncpg.connect(url, timeout=CONNECT_TIMEOUT,
                                 server_settings={"application_name": "orchestrator", **(settings or {})})


def holder_settings(lease_seconds: float) -> dict[str, str]:
    """The session settings of a (would-be) holder's connections: a session left idle inside a transaction
    (its process frozen mid-write) is ended by PostgreSQL itself after twice the lease, letting go of its locks;
    a statement waits for a lock at most a lease (a takeover that finds the row held retries at its next look)."""
    ms = max(int(lease_seconds * 1000), 100)
    return {"idle_in_transaction_session_timeout": str(2 * ms), "lock_timeout": str(ms)}


@contextmanager
def unreachable(where: str) -> Iterator[None]:
    """Around using a database: one that cannot be reached is a :class:`RepositoryError` naming it."""
    try:
        yield
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
        raise RepositoryError(f"cannot use the repository {where}: {type(exc).__name__}: {exc}; check "
                              "[repository] url (or --repository) and that the database server runs",
                              path=where) from exc


async def read_lease(url: str) -> LeaseView | None:
    """Who writes the repository at ``url`` now, and where it answers; ``None`` when it has no schema yet."""
    with unreachable(shown_url(url)):
        conn = await connect(url)
        try:
            if await schema.version(conn) is None:
                return None
            return await inspect(conn)
        finally:
            await conn.close()


class LeaseWatch:
    """A standby's eye on the lease (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: asyncpg.Connection | None = None

    async def look(self) -> LeaseView | None:
        """The lease now, its holder's session probed; ``None``: the database has no repository yet (free)."""
        try:
            with unreachable(shown_url(self.url)):
                if self._conn is None or self._conn.is_closed():
                    self._conn = await connect(self.url)
                if await schema.version(self._conn) is None:
                    return None
                return await inspect(self._conn, probe=True)
        except RepositoryError:
            await self.close()
            raise

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()
