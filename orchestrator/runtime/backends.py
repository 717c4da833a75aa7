"""The backends of one home: each one's driver, actor and monitor, made together on its first instruction.

An actor (:mod:`.actor`) carries out the instructions meant for its backend
and holds the runs its driver answered for; a monitor (:mod:`.monitor`)
watches them. Both read what a run starts from and leaves behind through
:class:`~.runs.RunFiles`, and post through the :class:`~.inbox.Inbox`: no
callback leads back into the runtime.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog
from anyio.abc import TaskGroup

from ..core.events import Event
from ..core.machine import StateMachine
from ..core.step import Step
from .actor import Actor
from .config import Config
from .definitions import Definitions
from .drivers import Drivers
from .inbox import Inbox
from .monitor import Monitor
from .repository import Repository
from .runs import RunFiles
from .writer import Writer


async def _detached(loop: Callable[[], Awaitable[None]]) -> None:
    """A long-lived task, started while some event was handled: it carries no stimulus id of its own."""
    structlog.contextvars.clear_contextvars()
    await loop()


class Backends:
    """See the module docstring. ``default_partitions``: a backend's slots when its settings name none."""

    def __init__(self, drivers: Drivers, config: Config, *, sm: StateMachine, inbox: Inbox,
                 definitions: Definitions, writer: Writer, repo: Repository, files: RunFiles,
                 default_partitions: int) -> None:
        self.drivers = drivers
        self.config = config
        self.sm = sm
        self.inbox = inbox
        self.definitions = definitions
        self.writer = writer
        self.repo = repo
        self.files = files
        self.default_partitions = default_partitions
        #: The runtime's task group, once it is open: each backend's loops run there.
        self.tg: TaskGroup | None = None
        self._actors: dict[str, Actor] = {}
        self._monitors: dict[str, Monitor] = {}

    async def actor(self, backend: str) -> Actor:
        """The backend's actor, made with its monitor (and their loops started) on first need."""
        actor = self._actors.get(backend)
        if actor is not None:
            return actor
        assert self.tg is not None, "the runtime is not running"
        driver = self.drivers.get(backend)
        context = driver.context
        log = context.log
        core = self.config.core
        concurrency = int(core["emulated_bulk_concurrency"])
        actor = Actor(backend, driver, post=self.inbox.answer, run_specs=self.definitions.run_specs, files=self.files,
                      record_ids=self.writer.record_ids, make_handle=self.definitions.run_handle,
                      concurrency=concurrency, log=log, chunk=int(core["submit_chunk"]),
                      capacity=int(core["actor_mailbox"]), confirm=self.repo.confirm_writer)
        monitor = Monitor(actor, post=self.inbox.post, files=self.files,
                          poll_interval=float(core["poll_interval"]), concurrency=concurrency, log=log)
        context.report = monitor.receive
        self._actors[backend], self._monitors[backend] = actor, monitor
        for loop in (actor.run, driver.serve, monitor.poll_forever):
            self.tg.start_soon(_detached, loop)
        return actor

    def free_slots(self, backend: str) -> int:
        """Runs the backend may take on now (``max_running`` less those held; at least one)."""
        capacity = self.config.backend(backend).get("max_running")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            capacity = self.default_partitions
        actor = self._actors.get(backend)
        return max(capacity - (actor.holding.statistics().held if actor is not None else 0), 1)

    # ------------------------------------------------------------ backpressure and quiet
    @property
    def lagging(self) -> bool:
        """Some backend's actor has a full mailbox (:attr:`Actor.lagging`)."""
        return any(a.lagging for a in self._actors.values())

    async def room(self) -> None:
        """Until no actor lags."""
        for actor in list(self._actors.values()):
            await actor.room()

    async def drained(self) -> None:
        """Until every actor carried out every instruction it took."""
        for actor in list(self._actors.values()):
            await actor.drained()

    def stop(self) -> None:
        """No monitoring tick starts from now on (a closing home, a graceful stop)."""
        for monitor in self._monitors.values():
            monitor.stopped = True

    async def refresh(self) -> None:
        """Ask every polled backend once, now (the CLI without a service, before a listing)."""
        if self.drivers.readonly:
            return  # the process that holds the home watches its backends
        for monitor in list(self._monitors.values()):
            await monitor.poll()

    def accepted(self, event: Event, step: Step) -> None:
        """The bus's hook: each change the state machine made reaches the runs held (their statuses are the
        core's, never a report's before the core judged it)."""
        if step.changes and self._actors:
            for change in step.changes:
                for actor in self._actors.values():
                    actor.holding.accepted(change.job, change.indexes, change.new)

    def forget(self, job: int) -> None:
        """A job removed: no backend holds its runs any longer."""
        for actor in self._actors.values():
            actor.holding.forget(job)

    # ------------------------------------------------------------ what monitoring shows
    def metrics(self) -> dict[str, Any]:
        """Each backend's counters: its driver's own, the ticks it was polled, the runs held and queued, faults."""
        out = {}
        for name, driver in self.drivers.items():
            monitor = self._monitors.get(name)
            actor = self._actors.get(name)
            out[name] = {"driver": driver.metrics(), "ticks": monitor.ticks if monitor else 0,
                         "held": actor.holding.statistics().held if actor else 0,
                         "queued": actor.queued if actor else 0, "faults": dict(actor.faults.counts) if actor else {}}
        return out

    def ticks(self) -> Mapping[str, tuple[int, float]]:
        """Each monitor's ticks and its last tick's seconds (for Prometheus)."""
        return {n: (m.ticks, m.last_tick) for n, m in self._monitors.items()}

    def faults(self) -> Mapping[str, Mapping[str, int]]:
        return {n: a.faults.counts for n, a in self._actors.items()}
