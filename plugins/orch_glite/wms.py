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

Start it with ``python -m orch_glite serve --listen 127.0.0.1:PORT --state DIR``
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

Layout: the persistent state (collections, nodes, ``wms.sqlite``) is in
:mod:`orch_glite.store`; launching nodes, reading the events file and the
scheduler loop are in :mod:`orch_glite.launcher`; this module is the HTTP
service and its ``serve`` entry point; :mod:`orch_glite.cli` is its command line
(``orchestrator wms serve``, ``python -m orch_glite serve``).
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
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import anyio
from anyio import CancelScope
from anyio.abc import ByteStream, SocketAttribute

from orchestrator.plugin import SettingsError
from orchestrator.plugin.accounts import AccountError, account_of, give
from orchestrator.plugin.wrapper import clear_outputs, prepare_local

# ``X as X``: re-exported, so that every name this module had before the split still imports from it.
from .launcher import KILL_GRACE as KILL_GRACE
from .launcher import LAUNCH_GRACE as LAUNCH_GRACE
from .launcher import LIVENESS_EVERY as LIVENESS_EVERY
from .launcher import TICK as TICK
from .launcher import NodeLauncher
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
from .store import SCHEMA as SCHEMA
from .store import Collection as Collection
from .store import Node as Node
from .store import Store as Store
from .store import active_pids as active_pids

GARBAGE = b"\x00\xff<<this is not the WMS protocol>>\xfe"


class StateLocked(RuntimeError):
    """Another service already uses this state directory."""


class WMS(NodeLauncher):
    """The service: an HTTP handler per connection and one scheduler loop, sharing in-memory state.

    Every mutation of that state is synchronous (no ``await`` in the middle),
    so handlers and the scheduler never see it half-changed and need no lock.
    The state and the scheduler are :class:`~orch_glite.launcher.NodeLauncher`'s;
    this class adds the state directory's lock, fault injection and the HTTP side.
    """

    def __init__(self, statedir: Path, *, max_running: int = 64, faults: Mapping[str, Any] | None = None,
                 launch_grace: float = LAUNCH_GRACE, kill_grace: float = KILL_GRACE) -> None:
        statedir.mkdir(parents=True, exist_ok=True)
        self._lockfile = open(statedir / "lock", "a+")  # noqa: SIM115 - held for the service's lifetime
        try:
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = (statedir / "wms.pid").read_text().strip() if (statedir / "wms.pid").exists() else "?"
            self._lockfile.close()
            raise StateLocked(f"{statedir} is in use by another WMS (pid {holder})") from None
        (statedir / "wms.pid").write_text(f"{os.getpid()}\n")
        self.faults = check_faults(faults or {})
        #: Service-wide ``drop`` / ``garbage`` counts not yet spent.
        self.remaining = {k: dict(self.faults.get(k, {})) for k in ("drop", "garbage")}
        super().__init__(statedir, max_running=max_running, launch_grace=launch_grace, kill_grace=kill_grace)
        #: Keys a lookup found no node under -> the lookup's epoch: a submission older than that epoch
        #: (one still in flight from a client that crashed) may no longer create a node under them.
        self.fences, self.epoch = self.store.load_fences()

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
        if parts == ["lookup"] and method == "POST":
            return self._lookup(_json_body(req))
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
        epoch = body.get("epoch", 0)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            return json_response(400, {"error": "'epoch' must be an integer >= 0"})
        collection = self.by_request.get(body["request"])
        if collection is None:
            collection = self._accept(body["request"], kind, specs, faults, epoch)
        else:
            self.log.info("submission repeated: same answer", collection=collection.id, request=body["request"])
        answer = collection.answer
        if kind == "node":
            entry = answer["nodes"][0]
            answer = {"collection": entry["collection"], "node": entry["node"], "error": entry["error"]}
        return self._faulty("submit", [collection], json_response(200, answer), collection=collection.id)

    def _accept(self, request: str, kind: str, specs: list[dict[str, Any]], faults: dict[str, Any],
                epoch: int = 0) -> Collection:
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
            if key is not None and epoch < self.fences.get(key, 0):  # sent before a lookup said "no node"
                entries.append({"key": key, "node": None, "collection": None,
                                "error": f"voided: a lookup (epoch {self.fences[key]}) found no node under this "
                                         f"key before this submission (epoch {epoch}) arrived"})
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
            account = account_of(run.owner)  # the node runs as its owner: one with an account here
        except AccountError as exc:
            return None, f"the node's owner cannot run here: {exc}"
        try:
            clear_outputs(run.outputdir)
            runfile = prepare_local(run, bindir=self.bindir, notify=self.events_of(run.owner))
            give(account, run.jobdir, run.outputdir, run.workdir, runfile)
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

    # --------------------------------------------------------------- lookup
    def _lookup(self, body: Any) -> bytes:
        """Which keys have a node; fence the others at a new epoch, on disk before the answer is sent.

        Synchronous, like ``_accept``: no submission is half-done while this runs. A submission
        that arrives later carrying an older epoch (one still in flight from a client that crashed)
        is refused for a fenced key, so "no node" stays true until the client sends it again with
        the new epoch; a node that exists is always found (``by_key``), whatever the epoch.
        """
        keys = body.get("keys") if isinstance(body, dict) else None
        if not isinstance(keys, list) or not all(isinstance(k, str) and k for k in keys):
            return json_response(400, {"error": "lookup needs 'keys': a list of node keys"})
        found: dict[str, dict[str, str] | None] = {}
        for key in keys:
            node = self.by_key.get(key)
            found[key] = None if node is None else {"collection": node.collection, "node": node.id}
        missing = [k for k, v in found.items() if v is None]
        self.epoch += 1
        self.store.fence(missing, self.epoch)
        self.fences.update(dict.fromkeys(missing, self.epoch))
        self.log.info("lookup", keys=len(found), found=len(found) - len(missing), epoch=self.epoch)
        return json_response(200, {"epoch": self.epoch, "nodes": found})

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


async def serve(listen: str, statedir: Path, *, max_running: int = 64, faults: Mapping[str, Any] | None = None,
                launch_grace: float = LAUNCH_GRACE, kill_grace: float = KILL_GRACE) -> None:
    """Run the service until it is told to stop."""
    from .protocol import parse_listen

    host, port = parse_listen(listen)
    if host == "localhost":
        host = "127.0.0.1"  # one address family, so that port 0 means one port
    wms = WMS(statedir, max_running=max_running, faults=faults, launch_grace=launch_grace, kill_grace=kill_grace)
    await wms.serve(host, port)

