"""The emulated WMS's persistent state: collections and nodes in ``DIR/wms.sqlite`` (SQLite, WAL).

:class:`Store` writes each change in one transaction, committed before the
service answers or starts a node (see :mod:`orch_glite.wms` for why);
:func:`active_pids` reads the same file from outside the service.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.plugin.wrapper import pid_alive

SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, request TEXT UNIQUE, created REAL NOT NULL,
    faults TEXT NOT NULL, remaining TEXT NOT NULL, answer TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, collection TEXT NOT NULL,
    key TEXT UNIQUE NOT NULL, idx INTEGER NOT NULL, fqid TEXT NOT NULL, spec TEXT NOT NULL,
    runfile TEXT NOT NULL, outputdir TEXT NOT NULL, shell TEXT NOT NULL,
    state TEXT NOT NULL, pid INTEGER, exit_code INTEGER, reason TEXT,
    submitted REAL NOT NULL, intent REAL, started REAL, ended REAL, abort_at REAL
);
CREATE TABLE IF NOT EXISTS fences (key TEXT PRIMARY KEY, epoch INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""
_NODE_FIELDS = ("state", "pid", "exit_code", "reason", "intent", "started", "ended")


@dataclass
class Node:
    id: str
    collection: str
    key: str
    index: int
    fqid: str
    spec: dict[str, Any]
    runfile: Path
    outputdir: Path
    shell: str
    state: str = "submitted"
    pid: int | None = None
    exit_code: int | None = None
    reason: str | None = None
    submitted: float = 0.0
    intent: float | None = None
    started: float | None = None
    ended: float | None = None
    abort_at: float | None = None

    def public(self) -> dict[str, Any]:
        return {"key": self.key, "index": self.index, "fqid": self.fqid, "state": self.state,
                "exit_code": self.exit_code, "reason": self.reason, "pid": self.pid}


@dataclass
class Collection:
    id: str
    kind: str
    request: str
    created: float
    faults: dict[str, Any]
    #: ``drop`` / ``garbage`` counts not yet spent: ``{"drop": {"status": 2}, ...}``.
    remaining: dict[str, dict[str, int]]
    answer: dict[str, Any]
    nodes: list[str] = field(default_factory=list)


class Store:
    """The service's state on disk: one SQLite file in the state directory."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: survives a killed process
        self.db.executescript(SCHEMA)

    def load(self) -> tuple[dict[str, Collection], dict[str, Node]]:
        collections = {
            row[0]: Collection(row[0], row[1], row[2], row[3], json.loads(row[4]), json.loads(row[5]),
                               json.loads(row[6]))
            for row in self.db.execute("SELECT id, kind, request, created, faults, remaining, answer FROM collections")
        }
        nodes: dict[str, Node] = {}
        for row in self.db.execute(
                "SELECT id, collection, key, idx, fqid, spec, runfile, outputdir, shell, state, pid, exit_code, "
                "reason, submitted, intent, started, ended, abort_at FROM nodes ORDER BY seq"):
            node = Node(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), Path(row[6]), Path(row[7]),
                        row[8], *row[9:])
            nodes[node.id] = node
            if node.collection in collections:
                collections[node.collection].nodes.append(node.id)
        return collections, nodes

    def load_fences(self) -> tuple[dict[str, int], int]:
        """Keys a lookup found no node under, with the lookup's epoch; and the last epoch handed out."""
        fences = {row[0]: int(row[1]) for row in self.db.execute("SELECT key, epoch FROM fences")}
        row = self.db.execute("SELECT value FROM meta WHERE name = 'epoch'").fetchone()
        return fences, int(row[0]) if row else 0

    def fence(self, keys: Iterable[str], epoch: int) -> None:
        """A lookup's epoch and the keys it fenced, in one transaction (before the answer is sent)."""
        with self._transaction():
            self.db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('epoch', ?)", (epoch,))
            self.db.executemany("INSERT OR REPLACE INTO fences (key, epoch) VALUES (?, ?)",
                                [(k, epoch) for k in keys])

    def add(self, collection: Collection, nodes: Iterable[Node]) -> None:
        """A new collection and its nodes, in one transaction (before the answer is sent)."""
        with self._transaction():
            self._put_collection(collection)
            self.db.executemany(
                "INSERT INTO nodes (id, collection, key, idx, fqid, spec, runfile, outputdir, shell, state, "
                "submitted, abort_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(n.id, n.collection, n.key, n.index, n.fqid, json.dumps(n.spec), str(n.runfile), str(n.outputdir),
                  n.shell, n.state, n.submitted, n.abort_at) for n in nodes])

    def _put_collection(self, c: Collection) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO collections (id, kind, request, created, faults, remaining, answer) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (c.id, c.kind, c.request, c.created, json.dumps(c.faults), json.dumps(c.remaining), json.dumps(c.answer)))

    def save(self, nodes: Iterable[Node], collections: Iterable[Collection] = ()) -> None:
        rows = [(*(getattr(n, f) for f in _NODE_FIELDS), n.id) for n in nodes]
        cols = list(collections)
        if not rows and not cols:
            return
        with self._transaction():
            self.db.executemany(f"UPDATE nodes SET {', '.join(f'{f} = ?' for f in _NODE_FIELDS)} WHERE id = ?", rows)
            for c in cols:
                self._put_collection(c)

    @contextlib.contextmanager
    def _transaction(self) -> Any:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def close(self) -> None:
        self.db.close()


def active_pids(statedir: Path) -> list[int]:
    """Pids of node wrappers a WMS in ``statedir`` started that still run (for cleaning up after tests).

    A pid counts only while its command line still names the node's run file, so a recycled pid is
    never mistaken for a node.
    """
    path = statedir / "wms.sqlite"
    if not path.exists():
        return []
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT pid, runfile FROM nodes WHERE pid IS NOT NULL").fetchall()
    finally:
        db.close()
    out = []
    for pid, runfile in rows:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if str(runfile).encode() in cmdline and pid_alive(pid):
            out.append(pid)
    return out
