"""The PostgreSQL repository's schema, its fence, and its migrations forward.

Everything lives in a schema of its own, ``orchestrator``, so the database
may hold other things. The tables are the SQLite repository's (version 3 of
:mod:`..schema`: jobs, run arrays as ``bytea``, sparse subjob rows, states),
except that a job's splitter is a column of its own: ``spec`` holds the
definition with the splitter's parameters left out (the form ``load``
reads), ``splitter`` the splitter in full (read when a split needs it).

The ``lease`` table has one row: who writes the repository now, until when
(``expires``, by the database's clock), where it answers (``address``), and
the fencing token, incremented by every takeover. Every data table has a
statement trigger, :data:`FENCE`, that refuses any write whose transaction
does not show the current token (``SELECT set_config('orchestrator.fence',
TOKEN, true)``) with SQLSTATE :data:`FENCED`: a writer that lost the lease
cannot write, whatever it does. The trigger locks the lease row ``FOR
SHARE`` until its transaction ends, so a takeover waits for a write under
way and the next one is refused: no write straddles a takeover.

A database is created (or migrated) under a transaction-scoped advisory
lock, so that two services opening a new database at once make one schema.
"""

from __future__ import annotations

import asyncpg

VERSION = 1
SCHEMA = "orchestrator"
#: The advisory lock (transaction scope) under which the schema is made or migrated: "orch" in ASCII.
SCHEMA_LOCK = 0x6F726368
#: The first key of the lease's session locks, ``(LEASE_LOCK, token)``: "orcl".
LEASE_LOCK = 0x6F72636C
#: The SQLSTATE of a write refused by the fence.
FENCED = "OR001"
#: The setting a write transaction shows its fencing token in.
FENCE_SETTING = "orchestrator.fence"
DATA_TABLES = ("meta", "jobs", "subjobs", "runs", "states")

FENCE = f"""
CREATE FUNCTION {SCHEMA}.fence() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    shown text := current_setting('{FENCE_SETTING}', true);
    current_token bigint;
BEGIN
    SELECT token INTO current_token FROM {SCHEMA}.lease WHERE id = 1 FOR SHARE;
    IF shown IS NULL OR shown = '' OR current_token IS DISTINCT FROM shown::bigint THEN
        RAISE EXCEPTION 'write refused: fencing token % is not the current one (%)',
            coalesce(nullif(shown, ''), 'none'), current_token
            USING ERRCODE = '{FENCED}', HINT = 'another orchestrator holds the repository''s lease now';
    END IF;
    RETURN NULL;
END $$"""

V1 = [
    f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
    f"CREATE TABLE {SCHEMA}.meta (key text PRIMARY KEY, value text NOT NULL)",
    f"""CREATE TABLE {SCHEMA}.jobs (
        id bigint PRIMARY KEY, name text NOT NULL, status text NOT NULL, spec text NOT NULL, splitter text,
        backend_id text, info text NOT NULL, n_subjobs integer NOT NULL DEFAULT 0,
        added double precision NOT NULL DEFAULT 0)""",
    f"""CREATE TABLE {SCHEMA}.subjobs (
        master bigint NOT NULL, idx integer NOT NULL, backend_id text, info text, delta text,
        PRIMARY KEY (master, idx))""",
    f"""CREATE TABLE {SCHEMA}.runs (
        job bigint PRIMARY KEY, status bytea NOT NULL, attempt bytea NOT NULL, t_submitting bytea NOT NULL,
        t_submitted bytea NOT NULL, t_running bytea NOT NULL, t_final bytea NOT NULL)""",
    f"""CREATE TABLE {SCHEMA}.states (
        job text NOT NULL, seq integer NOT NULL, time double precision NOT NULL, final boolean NOT NULL,
        data text NOT NULL, PRIMARY KEY (job, seq))""",
    f"""CREATE TABLE {SCHEMA}.lease (
        id integer PRIMARY KEY CHECK (id = 1), token bigint NOT NULL, holder text, address text,
        expires timestamptz, taken timestamptz)""",
    f"INSERT INTO {SCHEMA}.lease VALUES (1, 0, NULL, NULL, NULL, NULL)",
    # the idempotency keys' prefix, one for every home on the database (``orch-<key>-<fqid>-<attempt>``)
    f"INSERT INTO {SCHEMA}.meta VALUES ('home_key', substr(md5(random()::text || clock_timestamp()::text), 1, 8))",
    f"INSERT INTO {SCHEMA}.meta VALUES ('schema_version', '1')",
    FENCE,
    *(f"CREATE TRIGGER fenced BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {SCHEMA}.{table} "
      f"FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.fence()" for table in DATA_TABLES),
]


async def version(conn: asyncpg.Connection) -> int | None:
    """The schema version recorded in the database; ``None`` when it has no orchestrator schema yet."""
    if await conn.fetchval(f"SELECT to_regclass('{SCHEMA}.meta')") is None:
        return None
    value = await conn.fetchval(f"SELECT value FROM {SCHEMA}.meta WHERE key = 'schema_version'")
    return int(value) if value is not None else 0


async def create(conn: asyncpg.Connection) -> int:
    """Make the schema if the database has none (one transaction, under :data:`SCHEMA_LOCK`); its version."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
        found = await version(conn)
        if found is not None:
            return found
        for statement in V1:
            await conn.execute(statement)
        return VERSION


async def migrate(conn: asyncpg.Connection, found: int) -> None:
    """Bring the schema from ``found`` to :data:`VERSION`, in the caller's (fenced) transaction.

    Version 1 is the first: there is nothing to migrate yet. A later version adds its steps here, each
    guarded by ``if found < N``, and records its number in ``meta``.
    """
    await conn.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
    await conn.execute(f"UPDATE {SCHEMA}.meta SET value = $1 WHERE key = 'schema_version'", str(VERSION))
