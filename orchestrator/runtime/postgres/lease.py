"""The lease: which process writes a shared repository, with a fencing token, in the database itself.

One row (``orchestrator.lease``): the fencing token, the holder (a
description: role, PID, host, home), when the lease expires by the
database's clock, and where the holder answers (``address``, JSON: its
socket, TCP port, host name, PID). Besides, the holder keeps a session-level
advisory lock ``(LEASE_LOCK, token)`` on its lease connection: PostgreSQL
drops it the moment that connection closes, which is how a standby tells a
dead holder (its process gone, the lock free) from a live one at once,
without waiting for the expiry.

Taking the lease, by one who saw token ``T``:

1. it is free if nobody holds it (released), if it expired (the holder is
   frozen or cut off: it renewed nothing for ``lease_seconds``), or if the
   holder's advisory lock ``(LEASE_LOCK, T)`` can be taken (its session is
   gone; the probe lets go of it at once);
2. the taker first takes ``(LEASE_LOCK, T + 1)``, which only one can;
3. then ``UPDATE ... SET token = T + 1 ... WHERE token = T``: a compare and
   swap, so of two that raced only one gets it.

The holder renews (``expires = now() + lease_seconds``, only while the
token is still its own) every fifth of the lease; a renewal that finds
another token, or cannot reach the database, means the lease is lost. A
holder that closes gives it back (no holder, expired now), so a standby
takes over at once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import asyncpg

from .schema import LEASE_LOCK, SCHEMA


def lock_key(token: int) -> int:
    """The advisory lock's second key for a token (PostgreSQL's two-key locks take 32-bit integers)."""
    return token % 2**31


@dataclass(frozen=True)
class LeaseView:
    """The lease as one look at the database found it."""

    token: int
    holder: str | None
    address: dict[str, Any] | None
    #: Seconds until it expires, by the database's clock (negative: expired); ``None``: never taken.
    left: float | None
    #: Whether the holder's session still holds its advisory lock (``None``: not probed).
    alive: bool | None = None

    @property
    def free(self) -> bool:
        """May be taken: nobody holds it, it expired, or its holder's session is gone."""
        return self.holder is None or self.left is None or self.left <= 0 or self.alive is False

    def describe(self) -> str:
        if self.holder is None:
            return "nobody"
        where = ""
        if self.address:
            where = f", answering on {self.address.get('socket')}"
            if self.address.get("tcp_port") is not None:
                where += f" and {self.address.get('host')}:{self.address['tcp_port']} on {self.address.get('hostname')}"
        state = "" if self.left is None else (f"; its lease runs {self.left:.1f} s more" if self.left > 0 else
                                              f"; its lease expired {-self.left:.1f} s ago")
        return f"{self.holder}{where}{state}"


async def inspect(conn: asyncpg.Connection, *, probe: bool = False) -> LeaseView:
    """The lease now; ``probe``: also whether its holder's session is alive (takes and drops its lock)."""
    row = await conn.fetchrow(f"SELECT token, holder, address, EXTRACT(EPOCH FROM expires - now()) AS left "
                              f"FROM {SCHEMA}.lease WHERE id = 1")
    assert row is not None, "the lease row is made with the schema"
    token, holder = int(row["token"]), row["holder"]
    address = json.loads(row["address"]) if row["address"] else None
    left = float(row["left"]) if row["left"] is not None else None
    alive = None
    if probe and holder is not None and left is not None and left > 0:
        got = await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", LEASE_LOCK, lock_key(token))
        if got:
            await conn.execute("SELECT pg_advisory_unlock($1, $2)", LEASE_LOCK, lock_key(token))
        alive = not got
    return LeaseView(token, holder, address, left, alive)


async def end_expired_holder(conn: asyncpg.Connection) -> int:
    """End the sessions that hold a lock on the lease row (a write's share lock, a renewal's) in a transaction
    begun before the lease expired: the expired holder's, frozen or cut off mid-transaction (its transaction is
    rolled back, and it may not write again anyway: the fence refuses its token). Looks (``AccessShareLock``) and
    takers that came after the expiry are left alone. Returns how many were ended."""
    pids = await conn.fetch(
        f"SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        f"WHERE l.relation = '{SCHEMA}.lease'::regclass AND l.granted AND l.mode <> 'AccessShareLock' "
        f"AND l.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL "
        f"AND a.xact_start < (SELECT expires FROM {SCHEMA}.lease WHERE id = 1)")
    ended = 0
    for row in pids:
        if await conn.fetchval("SELECT pg_terminate_backend($1, 2000)", row["pid"]):
            ended += 1
    return ended


class Lease:
    """The lease as its holder sees it, on the holder's own connection (the one its advisory lock lives on)."""

    def __init__(self, conn: asyncpg.Connection, holder: str, seconds: float) -> None:
        self.conn = conn
        self.holder = holder
        self.seconds = seconds
        #: The fencing token while held.
        self.token: int | None = None
        #: Sessions of an expired holder this one ended to take the lease.
        self.ended = 0

    async def take(self) -> LeaseView | None:
        """Take the lease if it is free; ``None`` when taken (``token`` set), else the view that says who has it.

        An expired holder may be frozen inside a write transaction, its share lock on the lease row held for as
        long as it stays frozen: its sessions that hold a lock on the lease since before the lease expired are
        ended first (``pg_terminate_backend``), so the swap does not wait for it (``ended`` counts them)."""
        view = await inspect(self.conn, probe=True)
        if not view.free:
            return view
        taking = view.token + 1
        if not await self.conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", LEASE_LOCK, lock_key(taking)):
            return await inspect(self.conn)  # another is taking it over this very moment
        try:
            if view.holder is not None and view.left is not None and view.left <= 0:
                self.ended += await end_expired_holder(self.conn)
            row = await self.conn.fetchval(
                f"UPDATE {SCHEMA}.lease SET token = token + 1, holder = $2, address = NULL, taken = now(), "
                f"expires = now() + make_interval(secs => $3) WHERE id = 1 AND token = $1 RETURNING token",
                view.token, self.holder, self.seconds)
        except asyncpg.LockNotAvailableError:  # (lock_timeout) the row is still held: the next look tries again
            row = None
        if row is None:
            await self.conn.execute("SELECT pg_advisory_unlock($1, $2)", LEASE_LOCK, lock_key(taking))
            return await inspect(self.conn)
        self.token = int(row)
        return None

    async def renew(self) -> bool:
        """Push the expiry on; False when the token is no longer ours (another took over)."""
        if self.token is None:
            return False
        done = await self.conn.fetchval(
            f"UPDATE {SCHEMA}.lease SET expires = now() + make_interval(secs => $2) "
            f"WHERE id = 1 AND token = $1 RETURNING token", self.token, self.seconds)
        return done is not None

    async def publish(self, address: dict[str, Any]) -> None:
        """Say where the holder answers, for the clients of other homes (and the standby's)."""
        if self.token is not None:
            await self.conn.execute(f"UPDATE {SCHEMA}.lease SET address = $2 WHERE id = 1 AND token = $1",
                                    self.token, json.dumps(address))

    async def release(self) -> None:
        """Give the lease back: no holder, expired now (a standby takes over on its next look)."""
        if self.token is None:
            return
        token, self.token = self.token, None
        await self.conn.execute(f"UPDATE {SCHEMA}.lease SET holder = NULL, address = NULL, expires = now() "
                                f"WHERE id = 1 AND token = $1", token)
        await self.conn.execute("SELECT pg_advisory_unlock($1, $2)", LEASE_LOCK, lock_key(token))
