"""The runtime of one home: the state machine, the bus, the executor, the actors, the repository.

``await Runtime.open(home, config)`` inside a task group locks the home,
opens the repository (migrating it forward), restores every job into the
state machine and the definitions, hands each backend's actor the runs its
driver held, starts the bus and the flush loop, and posts ``Started`` (so
what a crash interrupted is settled). ``close()`` lets work under way finish
within ``close_grace``, writes everything, and lets go of the home.

Everything a user asks goes through ``request`` (:meth:`.Inbox.request`): an
event on the bus, answered by the state machine's ``Reply``. The class only
makes the pieces and wires them; what each owns is in its own module.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from ..core.errors import RepositoryError, RepositoryHeldError
from ..core.events import AddRequested, Started
from ..core.instructions import CreateLinked, Notify, Prepare, RunPostprocess, Unprepare
from ..core.machine import StateMachine
from ..plugin.logs import get_logger
from . import gcpause
from .backends import Backends
from .bus import Bus
from .checkpoints import Checkpoints, CheckpointSettings
from .config import Config
from .definitions import Definitions
from .drivers import Drivers
from .executor import Executor, OwnerSlots
from .homelock import SERVICE_ROLE, HomeLock
from .inbox import Inbox
from .limits import check_subjob
from .postprocess import Postprocessing
from .prepare import Preparer
from .reattach import reattach
from .runs import RunFiles
from .storage import Storage
from .story import Story
from .workspace import Workspace
from .writer import Writer, restore

if TYPE_CHECKING:
    from .metrics import Metrics


class Runtime:
    """One open home; see the module docstring. It makes the pieces and wires them; each owns its state:

    - :class:`~.inbox.Inbox`: the requests and their replies, the backpressure, a home lost or read only;
    - :class:`~.backends.Backends`: each backend's driver, actor (its held runs) and monitor;
    - :class:`~.checkpoints.Checkpoints` and :class:`~.runs.RunFiles`: what runs start from, save and leave;
    - :class:`~.prepare.Preparer`: new jobs stored, split and configured; :class:`~.definitions.Definitions`:
      what each job runs, and the core's edits of it;
    - :class:`~.executor.Executor`: a step's instructions carried out, each by the piece it concerns.
    """

    def __init__(self, home: Path, config: Config, *, role: str = "", readonly: bool = False,
                 lock: HomeLock | None = None) -> None:
        self.home = home
        #: A reader of a home another process holds: no lock, no monitoring, every request refused.
        self.readonly = readonly
        self.config = config
        self.role = role
        self.log = get_logger(home=str(home))
        self.sm = StateMachine(config.core["master_status_order"], lost_after=float(config.core["lost_after_seconds"]))
        self.storage = Storage.of(home, config.section("repository"))  # SQLite file, or shared PostgreSQL
        self.workspace = Workspace(self.storage.data_dir / "workspace")
        self.repo = self.storage.repository(role)
        #: The home's lock; ``lock``: one this process holds already (a service that waited as a standby).
        self._lock = lock if lock is not None else HomeLock(home / "lock", role)
        self.drivers = Drivers(self.storage.data_dir, config, readonly=readonly)
        self.tg: TaskGroup | None = None
        self.closing = False
        settings = CheckpointSettings.of(config.data.get("checkpoint", {}))
        self.definitions = Definitions(self.repo, self.workspace, retry_defaults=config.retry,
                                       max_restarts=settings.max_restarts, extra_env=settings.env,
                                       capabilities=self.drivers.capabilities, actions=config.actions,
                                       fail_on_missing_output=config.core["fail_on_missing_output"])
        self.writer = Writer(self.sm, self.repo, self.definitions, settings.keep)
        self.checkpoints = Checkpoints(settings, self.repo, self.sm, self.definitions, self.writer, self.log)
        self.bus = Bus(self.sm, self.log, observer_capacity=int(config.core["events_buffer"]))
        #: The way onto the bus; ``inbox.lost``: another process took a shared repository over (nothing more is
        #: written or sent).
        self.inbox = Inbox(self.bus, home, self.repo.where, readonly=readonly)
        self.backends = Backends(self.drivers, config, sm=self.sm, inbox=self.inbox, definitions=self.definitions,
                                 writer=self.writer, repo=self.repo, default_partitions=settings.default_partitions,
                                 files=RunFiles(self.sm, self.definitions, self.checkpoints))
        #: ``preparer.admission``: set by a service (its quotas).
        owner_slots = OwnerSlots(int(config.core["work_limit"]))
        self.preparer = Preparer(definitions=self.definitions, repo=self.repo, workspace=self.workspace,
                                 post=self.inbox.answer, sm=self.sm, free_slots=self.backends.free_slots,
                                 check_subjob=check_subjob, owner_slots=owner_slots)
        self.postprocessing = Postprocessing(sm=self.sm, definitions=self.definitions, workspace=self.workspace,
                                             settings=config.section("postprocess"), post=self.inbox.answer,
                                             log=self.log, owner_slots=owner_slots)
        self.executor = Executor(
            backends=self.backends, writer=self.writer, definitions=self.definitions, workspace=self.workspace,
            post=self.inbox.answer, reply=self.inbox.reply, log=self.log, work_limit=int(config.core["work_limit"]),
            work={Prepare: self.preparer.prepare, Unprepare: self.preparer.unprepare,
                  CreateLinked: self.preparer.create_linked, RunPostprocess: self.postprocessing.run,
                  Notify: self.postprocessing.notify}, owned=self.postprocessing.owned)
        self.inbox.laggards = (self.backends, self.executor)
        self.bus.hooks.append(self.backends.accepted)  # held runs take the statuses the core accepted
        #: Post a request and wait for its ``Reply`` (:meth:`.Inbox.request`).
        self.request = self.inbox.request
        #: A state the user handed in for the resubmission of that stimulus id (``resubmit --from-state``).
        self.given_state = self.executor.given_state
        #: Ask every polled backend once, now (the CLI without a service, before a listing).
        self.refresh = self.backends.refresh
        #: The recent steps, for ``orch.story(fqid)`` (:mod:`.story`): an append per step, read when asked.
        self.story = Story(int(config.core["story_length"]))
        self.bus.hooks.append(self.story.record)
        #: Prometheus metrics, for the service (``enable_prometheus``): an embedded runtime neither loads
        #: prometheus-client nor pays the bus hook.
        self.prometheus: Metrics | None = None
        if role == SERVICE_ROLE:
            self.enable_prometheus()
            from .eventlog import EventLog  # the service's log: a line per request and per batch of changes

            self.bus.hooks.append(EventLog(get_logger(component="events")))

    def enable_prometheus(self) -> Metrics:
        """Count from now on what ``GET /metrics`` serves; call before ``open`` to see the start's reconciling."""
        if self.prometheus is None:
            from .metrics import Metrics

            self.prometheus = Metrics(self.sm, queue_depth=lambda: self.bus.queued, monitors=self.backends.ticks,
                                      outputdir=self.workspace.outputdir, faults=self.backends.faults,
                                      refusals=lambda: self.writer.statistics().refused)
            self.bus.hooks.append(self.prometheus.observe)
            if self.tg is not None:
                self.tg.start_soon(self.prometheus.serve)
        return self.prometheus

    # ------------------------------------------------------------ life
    async def open(self, tg: TaskGroup) -> None:
        took_lock = not self.readonly and not self._lock.held  # a lock handed in stays its holder's to release
        if not self.readonly:
            self._lock.acquire()
        try:  # a reader reads the home as its writer last wrote it (statuses are written every ``flush_interval``)
            await self.repo.open(readonly=self.readonly)
            self.definitions.home_key = await self.repo.home_key()
            loaded = await self.repo.load()
            restore(self.sm, loaded, self.definitions)
            self.writer.loaded(loaded)
            self.preparer.next_job = await self.repo.next_id()
        except BaseException:
            await self.repo.close()
            if took_lock:
                self._lock.release()
            raise
        if self.readonly:
            return
        self.tg = self.executor.tg = self.backends.tg = tg
        tg.start_soon(self.bus.run, self.executor.carry_out)
        tg.start_soon(self._flush_loop)
        tg.start_soon(self._watch_repository)
        if self.prometheus is not None:
            tg.start_soon(self.prometheus.serve)
        # Runs the backends had when the home was last closed go back to their actors (:mod:`.reattach`).
        with gcpause.paused():  # a million handles, made and handed over a chunk at a time
            await reattach(self.sm, self.definitions, self.repo, self.backends.actor)
        await self.inbox.post(Started(stimulus_id=self.inbox.sid("start"), time=time.time()))

    async def _watch_repository(self) -> None:
        """A shared repository taken over by another process: from then on nothing is written or sent."""
        why = await self.repo.lost()
        self.inbox.lost = True
        self.log.error("this process may no longer write the repository: it writes nothing more and sends "
                       "nothing more to the backends", repository=self.repo.where, reason=why)
        await self.quiesce()

    async def close(self) -> None:
        """Let work under way finish (within ``close_grace``), write everything, let go of the home."""
        self.closing = True
        if self.readonly:
            await self.repo.close()
            await self.drivers.aclose(self.log)
            return
        try:
            with anyio.move_on_after(0 if self.inbox.lost else float(self.config.core["close_grace"])):
                await self.settle()
            with anyio.CancelScope(shield=True):
                self.backends.stop()
                try:
                    await self.writer.flush()
                except RepositoryHeldError:  # another process writes the repository now: it says so itself
                    raise
                except Exception as exc:
                    says = "SQLite says" if isinstance(exc, sqlite3.Error) else "the database says"
                    raise RepositoryError(
                        f"{self.repo.where}: the last write failed ({says} \"{exc}\"): what changed since the "
                        "previous write is not stored; the next start asks the backends again",
                        path=self.repo.where) from exc
                finally:  # whatever the last write did, the drivers and the file are closed
                    await self.drivers.aclose(self.log)
                    self.bus.close()
                    with anyio.move_on_after(float(self.config.core["close_grace"])):
                        while self.bus.busy:  # the step under way (past settle's grace) writes before the file closes
                            await self.bus.changed()
                    await self.repo.close()
        finally:
            self._lock.release()

    async def quiesce(self) -> None:
        """A graceful stop begins: no new monitoring tick starts; the events already posted are handled."""
        self.closing = True
        self.backends.stop()
        while self.bus.queued:
            await self.bus.changed()

    async def settle(self) -> None:
        """Until nothing posted is unhandled, no work is under way, no retry is on its way to a backend, and every
        actor has drained."""
        while True:
            await self.executor.idle.wait()
            await self.backends.drained()
            if not self.bus.queued and not self.executor.busy and not self.bus.busy and \
                    not self.sm.submitting_anywhere():
                await anyio.sleep(0)
                if not self.bus.queued and not self.executor.busy and not self.bus.busy:
                    return
            await self.bus.changed()

    async def _flush_loop(self) -> None:
        interval = float(self.config.core["flush_interval"])
        while True:
            await anyio.sleep(interval)
            if self.closing:  # close() writes the last changes itself, before the repository closes
                return
            try:
                await self.writer.flush()
            except Exception as exc:  # the repository's fault: logged, the changes stay to be written
                if self.inbox.lost or self.closing:
                    return
                self.log.error("could not write to the repository", error=repr(exc))

    # ------------------------------------------------------------ requests
    async def add(self, name: str, spec: dict[str, Any]) -> int:
        """Store a new top-level job and make it known; returns its id."""
        job, added = await self.preparer.store(name, spec, None)
        reply = await self.inbox.request(lambda sid: AddRequested(stimulus_id=sid, time=added, targets=((job,),),
                                                                  profile=self.definitions.profile(job)), "add")
        if reply.error is not None:
            raise reply.error
        return job

    def metrics(self) -> dict[str, Any]:
        """Counters of the runtime and of each backend (its driver's own, the ticks it was polled, the runs
        it holds): what monitoring shows, and what tests read instead of reaching inside."""
        return {"events": self.bus.handled, "jobs": len(self.sm.job_ids()), "backends": self.backends.metrics(),
                "work_waiting": self.executor.waiting_work}

    async def wait_until(self, done: Callable[[], bool], timeout: float | None) -> None:
        with anyio.fail_after(timeout if timeout is not None else math.inf):
            while not done():
                await self.bus.changed()
