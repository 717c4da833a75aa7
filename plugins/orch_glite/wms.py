"""An emulated gLite WMS: a service process that accepts collections of nodes and runs them locally.

Why an emulator: the ``glite`` backend exists to exercise real bulk
submission (one call for a whole collection, one status call per
collection, one cancel call, single-node resubmission beside a collection)
and the faults of a remote service (rejections, aborts, restarts, dropped
connections, nonsense answers). A real WMS cannot run here; this one keeps
the conversation's shape and the service's failure modes, and runs each node
on this machine through the orchestrator's own job wrapper, exactly as the
``local`` backend does (``sh wrapper.sh RUNFILE``, started with
``posix_spawn(setsid=True)`` so a node's whole process group can be ended,
and so that nodes outlive the service).

Start it with ``python -m orch_glite.wms serve --listen 127.0.0.1:PORT --state DIR``
(``PORT`` 0 picks a free port; the endpoint is written to ``DIR/endpoint``
once the service listens). The wire protocol is in :mod:`orch_glite.protocol`.

Durability: collections, nodes, their pids and states live in
``DIR/wms.sqlite`` (SQLite, WAL), committed before an answer is sent and
before a node is started, so a service killed at any moment loses nothing
it acknowledged and never starts a node twice: a node is marked
``launching`` (committed) before it is spawned, and a restarted service
never spawns a ``launching`` node again: it waits for that node's wrapper
to show up in the events file, and gives up on it (``aborted``) after a
grace period. Every wrapper appends a START and an END line to
``DIR/events.log`` (``ORCH_NOTIFY``), so a restarted service learns what
its nodes did while it was away by reading one file.

SQLite is used synchronously from the event loop: each statement is short,
state changes are written in one transaction per scheduler tick, and no
thread is needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import sqlite3
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from anyio import CancelScope
from anyio.abc import ByteStream, SocketAttribute

from orchestrator import SettingsError
from orchestrator.logs import get_logger
from orchestrator.wrapper import clear_outputs, install_scripts, pid_alive, prepare_local

from .protocol import (
    FINAL_STATES,
    PROTOCOL_VERSION,
    SERVICE,
    Request,
    WMSGarbage,
    check_faults,
    json_response,
    read_request,
    response,
    run_spec,
)

#: Seconds a ``launching`` node may go without its wrapper's START line before it is aborted.
LAUNCH_GRACE = 15.0
#: Seconds between SIGTERM and SIGKILL of a cancelled or aborted node's process group.
KILL_GRACE = 2.0
#: Seconds between two scheduler ticks (reap, read events, abort, launch, persist).
TICK = 0.02
#: Seconds between two liveness checks of nodes that are not our children (after a restart).
LIVENESS_EVERY = 0.5
GARBAGE = b"\x00\xff<<this is not the WMS protocol>>\xfe"

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


class StateLocked(RuntimeError):
    """Another service already uses this state directory."""


class WMS:
    """The service: an HTTP handler per connection and one scheduler loop, sharing in-memory state.

    Every mutation of that state is synchronous (no ``await`` in the middle),
    so handlers and the scheduler never see it half-changed and need no lock.
    """

    def __init__(self, statedir: Path, *, max_running: int = 64, faults: Mapping[str, Any] | None = None,
                 launch_grace: float = LAUNCH_GRACE, kill_grace: float = KILL_GRACE) -> None:
        self.statedir = statedir
        statedir.mkdir(parents=True, exist_ok=True)
        self._lockfile = open(statedir / "lock", "a+")  # noqa: SIM115 - held for the service's lifetime
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = (statedir / "wms.pid").read_text().strip() if (statedir / "wms.pid").exists() else "?"
            self._lockfile.close()
            raise StateLocked(f"{statedir} is in use by another WMS (pid {holder})") from None
        (statedir / "wms.pid").write_text(f"{os.getpid()}\n")
        self.max_running = max(1, int(max_running))
        self.faults = check_faults(faults or {})
        self.launch_grace = launch_grace
        self.kill_grace = kill_grace
        self.started = time.time()
        self.log = get_logger(service=SERVICE)
        self.bindir = statedir / "bin"
        self.wrapper = install_scripts(self.bindir)
        self.events = statedir / "events.log"
        self.events.touch(exist_ok=True)
        self.store = Store(statedir / "wms.sqlite")
        self.collections, self.nodes = self.store.load()
        self.by_key = {n.key: n for n in self.nodes.values()}
        self.by_request = {c.request: c for c in self.collections.values()}
        self.queue: deque[str] = deque(n.id for n in self.nodes.values() if n.state == "submitted")
        self.active: set[str] = {n.id for n in self.nodes.values() if n.state in ("launching", "running")}
        #: Service-wide ``drop`` / ``garbage`` counts not yet spent.
        self.remaining = {k: dict(self.faults.get(k, {})) for k in ("drop", "garbage")}
        self._children: set[int] = set()
        #: Children reaped since the last liveness check.
        self._reaped: set[int] = set()
        self._kills: list[tuple[float, int]] = []
        self._dirty: dict[str, Node] = {}
        self._dirty_collections: dict[str, Collection] = {}
        self._offset = 0
        self._partial = b""
        self._last_liveness = 0.0
        self._wake = anyio.Event()
        self._read_events()  # what the nodes did while no service watched them
        self._flush()
        if self.nodes:
            self.log.info("state loaded", collections=len(self.collections), nodes=len(self.nodes),
                          queued=len(self.queue), active=len(self.active))

    # ----------------------------------------------------------------- HTTP
    async def handle(self, stream: ByteStream) -> None:
        """One connection, one request. Never lets an error reach the listener: the service stays up."""
        async with stream:
            try:
                with anyio.fail_after(30):
                    request = await read_request(stream)
            except (WMSGarbage, TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError, OSError) as exc:
                with contextlib.suppress(Exception):
                    await stream.send(json_response(400, {"error": f"bad request: {exc}"}))
                return
            try:
                answer = await self.route(request)
            except Exception as exc:  # a bug here must not take the service down
                self.log.exception("request failed", method=request.method, path=request.path)
                answer = json_response(500, {"error": f"{type(exc).__name__}: {exc}"})
            if answer is None:
                return  # fault injection: the connection is closed without an answer
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                await stream.send(answer)

    async def route(self, req: Request) -> bytes | None:
        parts = [p for p in req.path.split("/") if p]
        if not parts or parts[0] != "v1":
            return json_response(404, {"error": f"no such endpoint {req.path!r}"})
        parts = parts[1:]
        method = req.method
        if parts == ["ping"] and method == "GET":
            return json_response(200, {"service": SERVICE, "protocol": PROTOCOL_VERSION, "pid": os.getpid(),
                                       "started": self.started, "nodes": len(self.nodes)})
        if parts == ["faults"]:
            if method == "GET":
                return json_response(200, {"faults": self.faults})
            if method == "PUT":
                return self._put_faults(_json_body(req))
        if parts == ["collections"] and method == "POST":
            return self._submit(_json_body(req), kind="collection")
        if parts == ["nodes"] and method == "POST":
            return self._submit(_json_body(req), kind="node")
        if len(parts) == 2 and parts[0] == "collections" and method == "GET":
            return await self._status(parts[1])
        if parts == ["cancel"] and method == "POST":
            return self._cancel(_json_body(req))
        if len(parts) in (3, 4) and parts[0] == "nodes" and parts[2] == "output" and method == "GET":
            return self._output(parts[1], parts[3] if len(parts) == 4 else None)
        return json_response(404 if method in ("GET", "POST", "PUT") else 405,
                             {"error": f"no such endpoint {method} {req.path}"})

    def _put_faults(self, body: Any) -> bytes:
        try:
            faults = check_faults(body if isinstance(body, Mapping) else {"?": body})
        except SettingsError as exc:
            return json_response(400, {"error": f"faults.{exc.field}: {exc}"})
        self.faults = faults
        self.remaining = {k: dict(faults.get(k, {})) for k in ("drop", "garbage")}
        self.log.warning("service-wide faults set", faults=faults)
        return json_response(200, {"faults": faults})

    def _fault(self, op: str, collections: Iterable[Collection]) -> str | None:
        """Spend one ``drop`` or ``garbage`` count for ``op`` (service-wide first); which, or ``None``."""
        for kind in ("drop", "garbage"):
            if self.remaining[kind].get(op, 0) > 0:
                self.remaining[kind][op] -= 1
                return kind
            for c in collections:
                left = c.remaining.get(kind, {})
                if left.get(op, 0) > 0:
                    left[op] -= 1
                    self._dirty_collections[c.id] = c
                    self._flush()  # spent counts survive a restart
                    return kind
        return None

    def _faulty(self, op: str, collections: Iterable[Collection], answer: bytes, **where: Any) -> bytes | None:
        kind = self._fault(op, list(collections))
        if kind is None:
            return answer
        self.log.warning("fault injected", fault=kind, request=op, **where)
        return None if kind == "drop" else response(200, GARBAGE)

    # --------------------------------------------------------------- submit
    def _submit(self, body: Any, kind: str) -> bytes | None:
        if not isinstance(body, dict) or not isinstance(body.get("request"), str) or not body["request"]:
            return json_response(400, {"error": "a submission needs a non-empty 'request' id"})
        specs = body.get("nodes") if kind == "collection" else [body.get("node")]
        if not isinstance(specs, list) or not specs or not all(isinstance(s, dict) for s in specs):
            return json_response(400, {"error": "a submission needs a non-empty list of node objects"})
        if not isinstance(body.get("faults") or {}, Mapping):
            return json_response(400, {"error": "'faults' must be an object"})
        try:
            faults = check_faults(body.get("faults") or {})
        except SettingsError as exc:
            return json_response(400, {"error": f"faults.{exc.field}: {exc}"})
        collection = self.by_request.get(body["request"])
        if collection is None:
            collection = self._accept(body["request"], kind, specs, faults)
        else:
            self.log.info("submission repeated: same answer", collection=collection.id, request=body["request"])
        answer = collection.answer
        if kind == "node":
            entry = answer["nodes"][0]
            answer = {"collection": entry["collection"], "node": entry["node"], "error": entry["error"]}
        return self._faulty("submit", [collection], json_response(200, answer), collection=collection.id)

    def _accept(self, request: str, kind: str, specs: list[dict[str, Any]], faults: dict[str, Any]) -> Collection:
        now = time.time()
        cid = f"c-{secrets.token_hex(6)}"
        reject = set(self.faults.get("reject", [])) | set(faults.get("reject", []))
        aborts = {**self.faults.get("abort", {}), **faults.get("abort", {})}
        entries: list[dict[str, Any]] = []
        new: list[Node] = []
        for spec in specs:
            key = spec.get("key") if isinstance(spec.get("key"), str) else None
            known = self.by_key.get(key) if key else None
            if known is not None:  # the same run submitted again (a retry): never run it twice
                entries.append({"key": key, "node": known.id, "collection": known.collection, "error": None})
                continue
            node, error = self._node(cid, spec, reject, aborts, now)
            entries.append({"key": key, "node": node.id if node else None, "collection": cid if node else None,
                            "error": error})
            if node is not None:
                new.append(node)
        accepted = [e["collection"] for e in entries if e["node"] is not None]
        collection = Collection(
            cid, kind, request, now, faults,
            {k: dict(faults.get(k, {})) for k in ("drop", "garbage")},
            {"collection": cid if new else (accepted[0] if accepted else None), "nodes": entries},
            [n.id for n in new])
        self.store.add(collection, new)
        self.collections[cid] = collection
        self.by_request[request] = collection
        for node in new:
            self.nodes[node.id] = node
            self.by_key[node.key] = node
            self.queue.append(node.id)
        self._wake.set()
        rejected = [e for e in entries if e["error"]]
        self.log.info("submission accepted", collection=cid, kind=kind, nodes=len(new), rejected=len(rejected),
                      fqids=[s.get("fqid") for s in specs][:5])
        for e, spec in zip(entries, specs, strict=True):
            if e["error"]:
                self.log.warning("node rejected", fqid=spec.get("fqid"), collection=cid, reason=e["error"])
        return collection

    def _node(self, cid: str, spec: dict[str, Any], reject: set[int], aborts: Mapping[str, float],
              now: float) -> tuple[Node | None, str | None]:
        """Check and prepare one node; ``(node, None)`` or ``(None, why it was rejected)``."""
        try:
            run = run_spec(spec)
        except ValueError as exc:
            return None, f"malformed node: {exc}"
        shell = spec.get("shell", "/bin/sh")
        if not isinstance(shell, str) or not os.access(shell, os.X_OK):
            return None, f"the shell {shell!r} is not executable on this WMS"
        if run.index in reject:
            return None, f"rejected by the WMS: no compatible resources for node {run.index} (fault injection)"
        exe = run.executable
        if os.path.isabs(exe) and not os.access(exe, os.X_OK):
            return None, f"executable {exe} does not exist or is not executable"
        try:
            clear_outputs(run.outputdir)
            runfile = prepare_local(run, bindir=self.bindir, notify=self.events)
        except OSError as exc:
            return None, f"cannot prepare the node's directories: {exc}"
        abort = aborts.get(str(run.index))
        node = Node(f"n-{secrets.token_hex(6)}", cid, run.key, run.index, run.fqid, spec, runfile, run.outputdir,
                    shell, submitted=now, abort_at=now + abort if abort is not None else None)
        return node, None

    # --------------------------------------------------------------- status
    async def _status(self, cid: str) -> bytes | None:
        collection = self.collections.get(cid)
        if collection is None:
            return json_response(404, {"error": f"unknown collection {cid}"})
        delay = max(float(self.faults.get("status_delay", 0.0)), float(collection.faults.get("status_delay", 0.0)))
        if delay:
            await anyio.sleep(delay)
        nodes = {nid: self.nodes[nid].public() for nid in collection.nodes}
        answer = json_response(200, {"collection": cid, "kind": collection.kind, "nodes": nodes})
        return self._faulty("status", [collection], answer, collection=cid)

    # --------------------------------------------------------------- cancel
    def _cancel(self, body: Any) -> bytes | None:
        ids = body.get("nodes") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return json_response(400, {"error": "cancel needs 'nodes': a list of node ids"})
        result: dict[str, dict[str, Any]] = {}
        touched: dict[str, Collection] = {}
        for nid in ids:
            node = self.nodes.get(nid)
            if node is None:
                result[nid] = {"state": None, "error": f"unknown node {nid}"}
                continue
            touched[node.collection] = self.collections[node.collection]
            if node.state not in FINAL_STATES:
                self._end(node, "cancelled", "cancelled by the user")
            result[nid] = {"state": node.state, "error": None}
        self._flush()  # a cancel is on disk before it is acknowledged
        return self._faulty("cancel", touched.values(), json_response(200, {"nodes": result}), nodes=len(ids))

    def _end(self, node: Node, state: str, reason: str | None) -> None:
        """Move a node to a final state; stop its processes if it has any."""
        node.state, node.reason, node.ended = state, reason, time.time()
        self.active.discard(node.id)
        if node.pid is not None:
            self._signal(node.pid, signal.SIGTERM)
            self._kills.append((time.time() + self.kill_grace, node.pid))
        self._dirty[node.id] = node
        if state == "aborted":
            self.log.warning("node aborted", fqid=node.fqid, node=node.id, collection=node.collection, reason=reason)

    @staticmethod
    def _signal(pid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)  # the wrapper leads its own session: the whole group

    # --------------------------------------------------------------- output
    def _output(self, nid: str, name: str | None) -> bytes:
        node = self.nodes.get(nid)
        if node is None:
            return json_response(404, {"error": f"unknown node {nid}"})
        if name is None:
            files = {p.name: p.stat().st_size for p in sorted(node.outputdir.iterdir()) if p.is_file()} \
                if node.outputdir.is_dir() else {}
            return json_response(200, {"node": nid, "outputdir": str(node.outputdir), "files": files})
        if name in (".", "..") or "/" in name or "\\" in name:
            return json_response(400, {"error": f"bad file name {name!r}"})
        path = node.outputdir / name
        if not path.is_file() or path.is_symlink():
            return json_response(404, {"error": f"node {nid} has no output file {name!r}"})
        return response(200, path.read_bytes(), "application/octet-stream")

    # ------------------------------------------------------------ scheduler
    async def run_scheduler(self) -> None:
        """Reap, learn from the events file, abort, launch and persist, every tick."""
        while True:
            self.tick()
            if self.queue or self.active or self._kills or self._children:
                await anyio.sleep(TICK)
            else:
                self._wake = anyio.Event()
                with anyio.move_on_after(1.0):
                    await self._wake.wait()

    def tick(self) -> None:
        now = time.time()
        dead = self._dead(now)
        self._read_events()
        for nid in dead:
            node = self.nodes[nid]
            if node.state in ("launching", "running"):
                why = ("the wrapper ended without an END line (killed or crashed)" if node.state == "running"
                       else "the wrapper exited before it started (see wrapper.out)")
                self._end(node, "aborted", why)
        for nid in list(self.active) + list(self.queue):
            node = self.nodes[nid]
            if node.abort_at is not None and now >= node.abort_at and node.state not in FINAL_STATES:
                self._end(node, "aborted", f"aborted by the WMS after {now - node.submitted:.1f} s (fault injection)")
            elif node.state == "launching" and node.pid is None and node.intent is not None \
                    and now - node.intent > self.launch_grace:
                self._end(node, "aborted", "the node was being started when the WMS stopped, and never started")
        self._launch()
        self._finish_kills(now)
        self._flush()

    def _dead(self, now: float) -> list[str]:
        """Active nodes whose wrapper is gone (checked before the events file is read)."""
        self._reap()
        check_all = now - self._last_liveness >= LIVENESS_EVERY
        if check_all:
            self._last_liveness = now
        dead = []
        for nid in self.active:
            node = self.nodes[nid]
            if node.pid is None:
                continue
            if node.pid in self._children:
                continue  # still ours and not reaped: alive
            if node.pid in self._reaped or (check_all and not self._is_wrapper(node)):
                dead.append(nid)
        self._reaped.clear()
        return dead

    def _reap(self) -> None:
        """Collect our exited children (no threads, no zombies)."""
        for pid in list(self._children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self._children.discard(pid)
                self._reaped.add(pid)

    @staticmethod
    def _is_wrapper(node: Node) -> bool:
        """Is ``node.pid`` still this node's wrapper (and not a recycled pid)?"""
        assert node.pid is not None
        if not pid_alive(node.pid):
            return False
        try:
            cmdline = Path(f"/proc/{node.pid}/cmdline").read_bytes()
        except OSError:
            return True
        return str(node.runfile).encode() in cmdline

    def _read_events(self) -> None:
        with open(self.events, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            parts = raw.decode(errors="replace").split()
            if len(parts) < 3:
                continue
            node = self.by_key.get(parts[0])
            if node is None:
                continue
            word, value = parts[1], parts[2]
            ts = _float(parts[3]) if len(parts) > 3 else None
            if word == "START" and value.isdigit():
                if node.state in ("submitted", "launching"):
                    node.state, node.pid, node.started = "running", int(value), ts or time.time()
                    self.active.add(node.id)
                    self._dirty[node.id] = node
                elif node.state in ("cancelled", "aborted") and node.pid is None:
                    node.pid = int(value)  # started after all (service restarted mid-launch): stop it
                    self._signal(node.pid, signal.SIGKILL)
                    self._dirty[node.id] = node
            elif word == "END" and node.state in ("submitted", "launching", "running"):
                node.state, node.exit_code, node.ended = "done", _int(value), ts or time.time()
                self.active.discard(node.id)
                self._dirty[node.id] = node

    def _launch(self) -> None:
        """Start queued nodes while slots are free: intent committed first, so none ever starts twice."""
        free = self.max_running - len(self.active)
        batch: list[Node] = []
        while self.queue and len(batch) < free:
            node = self.nodes[self.queue.popleft()]
            if node.state == "submitted":
                batch.append(node)
        if not batch:
            return
        now = time.time()
        for node in batch:
            node.state, node.intent = "launching", now
            self.active.add(node.id)
            self._dirty[node.id] = node
        self._flush()
        for node in batch:
            out = os.open(node.runfile.parent / "wrapper.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                pid = os.posix_spawn(
                    node.shell, [node.shell, str(self.wrapper), str(node.runfile)], os.environ,
                    file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                  (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)],
                    setsid=True,
                )
            except OSError as exc:
                self._end(node, "aborted", f"could not start the wrapper with {node.shell}: {exc.strerror}")
                continue
            finally:
                os.close(out)
            node.pid = pid
            self._children.add(pid)
        self._flush()

    def _finish_kills(self, now: float) -> None:
        keep = []
        for deadline, pid in self._kills:
            if now < deadline:
                keep.append((deadline, pid))
            else:
                self._signal(pid, signal.SIGKILL)
        self._kills = keep

    def _flush(self) -> None:
        if self._dirty or self._dirty_collections:
            self.store.save(self._dirty.values(), self._dirty_collections.values())
            self._dirty.clear()
            self._dirty_collections.clear()

    # ------------------------------------------------------------------ life
    async def serve(self, host: str, port: int) -> None:
        """Listen on ``host:port`` until SIGTERM or SIGINT; nodes keep running after the service stops."""
        listener = await anyio.create_tcp_listener(local_host=host, local_port=port)
        bound = listener.extra(SocketAttribute.local_port)
        endpoint = f"http://{host if ':' not in host else f'[{host}]'}:{bound}"
        tmp = self.statedir / "endpoint.tmp"
        tmp.write_text(endpoint + "\n")
        tmp.replace(self.statedir / "endpoint")
        self.log.info("listening", endpoint=endpoint, pid=os.getpid(), state=str(self.statedir))
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._stop_on_signal, tg.cancel_scope)
                tg.start_soon(self.run_scheduler)
                tg.start_soon(listener.serve, self.handle)
        finally:
            with anyio.CancelScope(shield=True):
                await listener.aclose()
            self.close()

    async def _stop_on_signal(self, scope: CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self.log.info("stopping", signal=signal.Signals(signum).name)
                scope.cancel()
                return

    def close(self) -> None:
        """Persist what is pending and release the state directory (running nodes are left alone)."""
        with contextlib.suppress(sqlite3.Error):
            self._flush()
            self.store.close()
        with contextlib.suppress(OSError):
            (self.statedir / "endpoint").unlink()
        self._lockfile.close()


def _json_body(req: Request) -> Any:
    try:
        return json.loads(req.body or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


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


async def serve(listen: str, statedir: Path, *, max_running: int = 64, faults: Mapping[str, Any] | None = None,
                launch_grace: float = LAUNCH_GRACE, kill_grace: float = KILL_GRACE) -> None:
    """Run the service until it is told to stop."""
    from .protocol import parse_listen

    host, port = parse_listen(listen)
    if host == "localhost":
        host = "127.0.0.1"  # one address family, so that port 0 means one port
    wms = WMS(statedir, max_running=max_running, faults=faults, launch_grace=launch_grace, kill_grace=kill_grace)
    await wms.serve(host, port)


def main() -> None:
    """``python -m orch_glite.wms serve ...``: the same command as ``orchestrator wms serve``."""
    from .cli import wms_group

    wms_group(prog_name="python -m orch_glite.wms")


if __name__ == "__main__":
    main()
