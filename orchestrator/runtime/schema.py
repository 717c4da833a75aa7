"""The repository's SQLite schema, and its migrations forward.

Version 3 keeps what every run of a job has as one row per job of compact
arrays (``runs``: status codes, attempt counters and entry times as blobs,
the state machine's own tables), and what only some runs have in a row per
subjob (``subjobs``: its backend id, its extras as JSON when it has any, and
the splitter's delta to the master's definition). Opening a master of a
million subjobs reads one row of blobs, not a million rows.

A home written by an earlier version is migrated forward on open, one
version per transaction.
"""

from __future__ import annotations

import json
from array import array
from typing import Any

import aiosqlite

from ..core.statuses import JobStatus
from ..core.table import SPARSE_TIMED

VERSION = 3

V1 = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE jobs (
        id INTEGER PRIMARY KEY, name TEXT NOT NULL, status TEXT NOT NULL, spec TEXT NOT NULL,
        backend_id TEXT, info TEXT NOT NULL, n_subjobs INTEGER NOT NULL DEFAULT 0, master TEXT)""",
    """CREATE TABLE subjobs (
        master INTEGER NOT NULL, idx INTEGER NOT NULL, name TEXT NOT NULL, status TEXT NOT NULL,
        spec TEXT NOT NULL, backend_id TEXT, info TEXT NOT NULL, PRIMARY KEY (master, idx)) WITHOUT ROWID""",
]
V2 = [
    """CREATE TABLE states (
        job TEXT NOT NULL, seq INTEGER NOT NULL, time REAL NOT NULL, final INTEGER NOT NULL,
        data TEXT NOT NULL, PRIMARY KEY (job, seq)) WITHOUT ROWID""",
]
V3_TABLES = [
    """CREATE TABLE runs (
        job INTEGER PRIMARY KEY, status BLOB NOT NULL, attempt BLOB NOT NULL, t_submitting BLOB NOT NULL,
        t_submitted BLOB NOT NULL, t_running BLOB NOT NULL, t_final BLOB NOT NULL)""",
    """CREATE TABLE subjobs_v3 (
        master INTEGER NOT NULL, idx INTEGER NOT NULL, backend_id TEXT, info TEXT, delta TEXT,
        PRIMARY KEY (master, idx)) WITHOUT ROWID""",
]
TIME_COLUMNS = ("t_submitting", "t_submitted", "t_running", "t_final")
#: What a v2 info dict held that v3 keeps in the run arrays instead.
_ARRAY_KEYS = ("submit_counter", "timestamps")


async def migrate(db: aiosqlite.Connection, version: int) -> None:
    """Bring the schema from ``version`` to :data:`VERSION`; the caller holds one transaction per step."""
    if version < 1:
        for statement in V1:
            await db.execute(statement)
    if version < 2:
        for statement in V2:
            await db.execute(statement)
    if version < 3:
        await _to_v3(db)


async def _to_v3(db: aiosqlite.Connection) -> None:
    """Per-run status, attempts and times move into arrays; subjob rows keep only what is sparse."""
    for statement in V3_TABLES:
        await db.execute(statement)
    codes = {s.value: s.code for s in JobStatus}
    async with db.execute("SELECT id, n_subjobs, status, info, master FROM jobs ORDER BY id") as cur:
        tops = await cur.fetchall()
    for job_id, n, status, info_text, master_text in tops:
        info = json.loads(info_text)
        await db.execute("UPDATE jobs SET info=? WHERE id=?", (json.dumps(
            _top_info(info, json.loads(master_text) if master_text else {}, bool(n)), separators=(",", ":")),
            job_id))
        if n:
            async with db.execute("SELECT idx, status, spec, backend_id, info FROM subjobs WHERE master=? "
                                  "ORDER BY idx", (job_id,)) as cur:
                rows = await cur.fetchall()
            infos = [json.loads(r[4]) for r in rows]
            statuses = bytearray(codes[r[1]] for r in rows)
            await db.executemany("INSERT INTO subjobs_v3 VALUES (?, ?, ?, ?, ?)", [
                (job_id, r[0], r[3], _extras_json(i), r[2]) for r, i in zip(rows, infos, strict=True)])
        else:
            infos = [info]
            statuses = bytearray([codes[status]])
        await db.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)", (job_id, *run_blobs(statuses, infos)))
    await db.execute("DROP TABLE subjobs")
    await db.execute("ALTER TABLE subjobs_v3 RENAME TO subjobs")
    await db.execute("ALTER TABLE jobs ADD COLUMN added REAL NOT NULL DEFAULT 0")
    await db.execute("UPDATE jobs SET added = COALESCE(json_extract(info, '$.timestamps.new'), 0)")


def run_blobs(statuses: bytearray, infos: list[dict[str, Any]]) -> tuple[bytes, ...]:
    """A v2 job's runs as v3 arrays."""
    attempts = array("I", (int(i.get("submit_counter", 0)) for i in infos))
    times = []
    for column in TIME_COLUMNS:
        key = column[2:]
        times.append(array("d", (float(i.get("timestamps", {}).get(key, 0.0)) for i in infos)).tobytes())
    return (bytes(statuses), attempts.tobytes(), *times)


def _top_info(info: dict[str, Any], master: dict[str, Any], is_master: bool) -> dict[str, Any]:
    """A v2 top-level info (and master record) in v3's form (:func:`orchestrator.core.records.stored_info`)."""
    stamps = dict(info.get("timestamps", {}))
    out: dict[str, Any] = {"partition": info.get("partition", {}), "merged_at": stamps.pop("merged", 0.0),
                           "post_failed": bool(master.get("postprocess_failed", False))}
    if is_master:
        top = {k: v for k, v in info.items() if k not in (*_ARRAY_KEYS, "partition") and v}
        top["timestamps"] = stamps
        out.update(top=top, attempt=int(info.get("submit_counter", 0)))
    else:
        out["top"] = {"timestamps": {"new": stamps.get("new", 0.0)}}
        extras = _extras_json({k: v for k, v in info.items() if k != "partition"})
        out["run"] = json.loads(extras) if extras else {}
    return out


def _extras_json(info: dict[str, Any]) -> str | None:
    extras = {k: v for k, v in info.items() if k not in _ARRAY_KEYS and v}
    stamps = {k: v for k, v in info.get("timestamps", {}).items() if k in SPARSE_TIMED}
    if stamps:
        extras["timestamps"] = stamps
    return json.dumps(extras, separators=(",", ":")) if extras else None
