"""The emulated WMS's nodes at work: launching wrappers, reading their events file, aborting and killing.

:class:`NodeLauncher` holds the service's in-memory state (loaded from its
:class:`~orch_glite.store.Store`) and runs the scheduler loop: every tick it
reaps exited wrappers, reads the START / END lines they appended to
``DIR/events.log``, aborts nodes that are due, launches queued nodes while
slots are free and persists what changed. The HTTP side is
:class:`orch_glite.wms.WMS`, which builds on it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import deque
from pathlib import Path

import anyio

from orchestrator.plugin.accounts import AccountError, account_of, argv_as, give
from orchestrator.plugin.logs import get_logger
from orchestrator.plugin.wrapper import (
    EventLines,
    SpawnError,
    event_pid,
    install_scripts,
    pid_alive,
    reap_children,
    spawn_wrapper,
)

from .protocol import FINAL_STATES, SERVICE
from .store import Collection, Node, Store

#: Seconds a ``launching`` node may go without its wrapper's START line before it is aborted.
LAUNCH_GRACE = 15.0
#: Seconds between SIGTERM and SIGKILL of a cancelled or aborted node's process group.
KILL_GRACE = 2.0
#: Seconds between two scheduler ticks (reap, read events, abort, launch, persist).
TICK = 0.02
#: Seconds between two liveness checks of nodes that are not our children (after a restart).
LIVENESS_EVERY = 0.5


class NodeLauncher:
    """The nodes of one state directory and the scheduler loop that launches, watches and stops them.

    Every mutation of the state is synchronous (no ``await`` in the middle),
    so the scheduler and the service's handlers never see it half-changed.
    """

    def __init__(self, statedir: Path, *, max_running: int = 64, launch_grace: float = LAUNCH_GRACE,
                 kill_grace: float = KILL_GRACE) -> None:
        self.statedir = statedir
        self.max_running = max(1, int(max_running))
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
        self._children: set[int] = set()
        #: Children reaped since the last liveness check.
        self._reaped: set[int] = set()
        self._kills: list[tuple[float, int]] = []
        self._dirty: dict[str, Node] = {}
        self._dirty_collections: dict[str, Collection] = {}
        self._event_lines = EventLines()
        #: Each owner's own events file (their wrappers write only there) and how far it was read.
        self._owner_events: dict[str, tuple[Path, EventLines]] = {}
        for node in self.nodes.values():
            if node.spec.get("owner"):
                self.events_of(str(node.spec["owner"]))
        self._last_liveness = 0.0
        self._wake = anyio.Event()
        self._read_events()  # what the nodes did while no service watched them
        self._flush()
        if self.nodes:
            self.log.info("state loaded", collections=len(self.collections), nodes=len(self.nodes),
                          queued=len(self.queue), active=len(self.active))

    # ---------------------------------------------------------------- ending
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
        self._reaped |= reap_children(self._children)
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

    def events_of(self, owner: str | None) -> Path:
        """The events file the wrappers of ``owner``'s nodes write (``None``: the WMS's own user's): an owner's is
        theirs alone (0600), and its lines count for their nodes only."""
        if owner is None:
            return self.events
        known = self._owner_events.get(owner)
        if known is None:
            path = self.statedir / f"events-{owner}.log"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.close(fd)
            give(account_of(owner), path)
            known = self._owner_events[owner] = (path, EventLines())
        return known[0]

    def _read_events(self) -> None:
        lines: list[tuple[list[str], str | None]] = [(parts, None) for parts in self._event_lines.read(self.events)]
        for name, (path, reader) in self._owner_events.items():
            lines += [(parts, name) for parts in reader.read(path)]
        for parts, writer in lines:
            node = self.by_key.get(parts[0])
            if node is None or (writer is not None and node.spec.get("owner") != writer):
                continue
            word, value = parts[1], parts[2]
            ts = _float(parts[3]) if len(parts) > 3 else None
            if word == "START" and (pid := event_pid(value)) is not None:
                if node.state in ("submitted", "launching"):
                    node.state, node.pid, node.started = "running", pid, ts or time.time()
                    self.active.add(node.id)
                    self._dirty[node.id] = node
                elif node.state in ("cancelled", "aborted") and node.pid is None:
                    node.pid = pid  # started after all (service restarted mid-launch): stop it
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
            try:
                owner = node.spec.get("owner")
                prefix = argv_as(account_of(str(owner))) if owner else []  # an owner's node runs as its owner
                pid = spawn_wrapper(node.shell, self.wrapper, node.runfile, prefix)
            except (SpawnError, AccountError) as exc:
                self._end(node, "aborted", str(exc))
                continue
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
