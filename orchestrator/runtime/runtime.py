"""The runtime of one home: the state machine, the bus, the executor, the actors, the repository.

``await Runtime.open(home, config)`` inside a task group locks the home,
opens the repository (migrating it forward), restores every job into the
state machine and the definitions, hands each backend's actor the runs its
driver held, starts the bus and the flush loop, and posts ``Started`` (so
what a crash interrupted is settled). ``close()`` lets work under way finish
within ``close_grace``, writes everything, and lets go of the home.

Everything a user asks goes through :meth:`request`: an event on the bus,
answered by the state machine's ``Reply``.
"""

from __future__ import annotations

import itertools
import math
import sqlite3
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from anyio.abc import TaskGroup

from ..core.actions import scaled
from ..core.errors import HomeLockedError, RepositoryError, RepositoryHeldError
from ..core.events import AddRequested, Event, Request, Started
from ..core.instructions import (
    AdjustRun,
    CreateLinked,
    Forget,
    Notify,
    Prepare,
    Reply,
    RunPostprocess,
    SetBackend,
    Unprepare,
)
from ..core.machine import StateMachine
from ..core.statuses import JobStatus
from ..plugin.contract import Capabilities, Driver, RunHandle
from ..plugin.logs import get_logger
from . import gcpause
from .actor import Actor
from .bus import Bus
from .checkpoints import Checkpoints
from .config import Config
from .definitions import Definitions
from .drivers import Drivers
from .executor import Executor
from .held import RunKey
from .homelock import SERVICE_ROLE, HomeLock
from .limits import check_subjob
from .monitor import Ending, Monitor
from .postprocess import Postprocessing
from .prepare import Preparer
from .reattach import reattach
from .repository import TIME_KINDS, RunsRow, StateRow, TopRow
from .runs import read_ending
from .storage import Storage
from .story import Story
from .workspace import Workspace
from .writer import Writer, restore

if TYPE_CHECKING:
    from .metrics import Metrics


async def _detached(loop: Callable[[], Awaitable[None]]) -> None:
    """A long-lived task, started while some event was handled: it carries no stimulus id of its own."""
    structlog.contextvars.clear_contextvars()
    await loop()


class Runtime:
    """One open home; see the module docstring."""

    def __init__(self, home: Path, config: Config, *, role: str = "", readonly: bool = False,
                 lock: HomeLock | None = None) -> None:
        self.home = home
        #: A reader of a home another process holds: no lock, no monitoring, every request refused.
        self.readonly = readonly
        self.config = config
        self.role = role
        self.log = get_logger(home=str(home))
        self.sm = StateMachine(config.core["master_status_order"])
        self.storage = Storage.of(home, config.section("repository"))  # SQLite file, or shared PostgreSQL
        self.workspace = Workspace(self.storage.data_dir / "workspace")
        self.repo = self.storage.repository(role)
        #: The home's lock; ``lock``: one this process holds already (a service that waited as a standby).
        self._lock = lock if lock is not None else HomeLock(home / "lock", role)
        #: Set when another process took a shared repository over: nothing more is written or sent.
        self.lost = False
        self._ids = itertools.count()
        self._next_job: int | None = None
        self._actors: dict[str, Actor] = {}
        self._monitors: dict[str, Monitor] = {}
        self.drivers = Drivers(self.storage.data_dir, config, readonly=readonly)
        self._given: dict[str, str] = {}
        self._added: dict[int, float] = {}
        self.tg: TaskGroup | None = None
        self.closing = False
        checkpoint = config.data.get("checkpoint", {})
        self.checkpoints = Checkpoints(checkpoint, self.repo, self._checkpoint_record, self._spec_of_fqid,
                                       self._store_state, self.log)
        self.definitions = Definitions(self.repo, self.workspace, retry_defaults=config.retry,
                                       max_restarts=self.checkpoints.max_restarts, extra_env=self.checkpoints.env,
                                       capabilities=self.capabilities, actions=config.actions,
                                       fail_on_missing_output=config.core["fail_on_missing_output"])
        self.writer = Writer(self.sm, self.repo, self.definitions, self.checkpoints.keep)
        #: Set by a service: raises a JobError when a job's runs may not become active (its quotas).
        self.admission: Callable[[int, Mapping[str, Any], int], None] | None = None
        self.preparer = Preparer(definitions=self.definitions, repo=self.repo, workspace=self.workspace,
                                 post=self.answer, sm=self.sm, free_slots=self.free_slots,
                                 check_subjob=check_subjob, add_job=self._store_job, admit=self._admit)
        self.postprocessing = Postprocessing(sm=self.sm, definitions=self.definitions, workspace=self.workspace,
                                             settings=config.section("postprocess"), post=self.answer, log=self.log)
        self.executor = Executor(
            actor=self.actor, flush=self.writer.flush, forget=self._forget, set_backend=self._set_backend,
            given_state=self._given.get, post=self.answer, log=self.log, adjust=self._adjust,
            work_limit=int(config.core["work_limit"]),
            work={Prepare: self.preparer.prepare, Unprepare: self.preparer.unprepare,
                  CreateLinked: self.preparer.create_linked, RunPostprocess: self.postprocessing.run,
                  Notify: self.postprocessing.notify})
        self.bus = Bus(self.sm, self.executor, self.log, observer_capacity=int(config.core["events_buffer"]))
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

            self.prometheus = Metrics(self.sm, queue_depth=lambda: self.bus._in.statistics().current_buffer_used,
                                      monitors=lambda: {n: (m.ticks, m.last_tick) for n, m in self._monitors.items()},
                                      outputdir=self.workspace.outputdir,
                                      faults=lambda: {n: a.faults.counts for n, a in self._actors.items()})
            self.bus.hooks.append(self.prometheus.observe)
            if self.tg is not None:
                self.tg.start_soon(self.prometheus.serve)
        return self.prometheus

    # ------------------------------------------------------------ life
    async def open(self, tg: TaskGroup) -> None:
        if self.readonly:
            await self._open_to_read()
            return
        took_lock = not self._lock.held  # a lock handed in stays its holder's to release
        self._lock.acquire()
        try:
            await self.repo.open()
            self.definitions.home_key = await self.repo.home_key()
            loaded = await self.repo.load()
            restore(self.sm, loaded, self.definitions)
            self.writer.loaded(loaded)
            self._next_job = await self.repo.next_id()
        except BaseException:
            await self.repo.close()
            if took_lock:
                self._lock.release()
            raise
        self.tg = self.executor.tg = tg
        tg.start_soon(self.bus.run)
        tg.start_soon(self._flush_loop)
        tg.start_soon(self._watch_repository)
        if self.prometheus is not None:
            tg.start_soon(self.prometheus.serve)
        await self._reattach()
        await self.post(Started(stimulus_id=self.sid("start"), time=time.time()))

    async def _watch_repository(self) -> None:
        """A shared repository taken over by another process: from then on nothing is written or sent."""
        why = await self.repo.lost()
        self.lost = True
        self.log.error("this process may no longer write the repository: it writes nothing more and sends "
                       "nothing more to the backends", repository=self.repo.where, reason=why)
        await self.quiesce()

    async def _open_to_read(self) -> None:
        """Read the home as its writer last wrote it (statuses are written every ``flush_interval``)."""
        try:
            await self.repo.open(readonly=True)
            self.definitions.home_key = await self.repo.home_key()
            restore(self.sm, await self.repo.load(), self.definitions)
            self._next_job = await self.repo.next_id()
        except BaseException:
            await self.repo.close()
            raise

    async def _reattach(self) -> None:
        """Runs the backends had when the home was last closed go back to their actors (:mod:`.reattach`)."""
        with gcpause.paused():  # a million handles, made and handed over a chunk at a time
            await reattach(self.sm, self.definitions, self.repo, self.actor)

    async def close(self) -> None:
        """Let work under way finish (within ``close_grace``), write everything, let go of the home."""
        self.closing = True
        if self.readonly:
            await self.repo.close()
            await self.drivers.aclose(self.log)
            return
        try:
            with anyio.move_on_after(0 if self.lost else float(self.config.core["close_grace"])):
                await self.settle()
            with anyio.CancelScope(shield=True):
                for monitor in self._monitors.values():
                    monitor.stopped = True
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
        for monitor in self._monitors.values():
            monitor.stopped = True
        while self.bus._in.statistics().current_buffer_used:
            await self.bus.changed()

    async def settle(self) -> None:
        """Until nothing posted is unhandled, no work is under way, and every actor has drained."""
        while True:
            await self.executor.idle.wait()
            for actor in list(self._actors.values()):
                await actor.drained()
            stats = self.bus._in.statistics()
            if stats.current_buffer_used == 0 and not self.executor.busy and not self.bus.busy and not self._retrying():
                await anyio.sleep(0)
                if self.bus._in.statistics().current_buffer_used == 0 and not self.executor.busy and not self.bus.busy:
                    return
            await self.bus.changed()

    def _retrying(self) -> bool:
        return self.sm.submitting_anywhere()

    async def _flush_loop(self) -> None:
        interval = float(self.config.core["flush_interval"])
        while True:
            await anyio.sleep(interval)
            if self.closing:  # close() writes the last changes itself, before the repository closes
                return
            try:
                await self.writer.flush()
            except Exception as exc:  # the repository's fault: logged, the changes stay to be written
                if self.lost or self.closing:
                    return
                self.log.error("could not write to the repository", error=repr(exc))

    # ------------------------------------------------------------ requests
    def sid(self, kind: str) -> str:
        return f"{kind}-{next(self._ids)}"

    async def post(self, event: Event) -> None:
        """Post a request or a monitoring report, once no backend's actor and not the executor lags
        (backpressure: nothing piles up without bound)."""
        while True:
            lagging = next((a for a in self._actors.values() if a.lagging), None)
            if lagging is None and not self.executor.lagging:
                break
            await (lagging.room() if lagging is not None else self.executor.room())
        await self.answer(event)

    async def answer(self, event: Event) -> None:
        """Post the outcome of an instruction (a driver's answer, prepared work, a timer): it never waits
        for room, since what it answers is what drains the backlog."""
        if self.lost:
            raise RepositoryHeldError(f"this orchestrator may no longer write the repository {self.repo.where} "
                                      "(another took it over, or its lease could not be renewed): open it again")
        if self.readonly:
            raise HomeLockedError(f"orchestrator home {self.home} is in use by another process, so it is open "
                                  f"here to read only; to share a home between processes, run "
                                  f"'orchestrator --home {self.home} serve' and every command goes through it")
        await self.bus.post(event)

    async def request(self, make: Callable[[str], Request], kind: str) -> Reply:
        """Post a request and wait for its answer."""
        sid = self.sid(kind)
        waiting = self.executor.expect(sid)
        await self.post(make(sid))
        await waiting.done.wait()
        assert waiting.reply is not None
        return waiting.reply

    async def add(self, name: str, spec: dict[str, Any]) -> int:
        """Store a new top-level job and make it known; returns its id."""
        job = await self._store_job(name, spec, None)
        added = self._added.pop(job)
        reply = await self.request(lambda sid: AddRequested(stimulus_id=sid, time=added, targets=((job,),),
                                                            profile=self.definitions.profile(job)), "add")
        if reply.error is not None:
            raise reply.error
        return job

    async def _store_job(self, name: str, spec: dict[str, Any], link: tuple[int, str] | None) -> int:
        if self._next_job is None:
            self._next_job = await self.repo.next_id()
        job = self._next_job
        self._next_job += 1
        now = time.time()
        info: dict[str, Any] = {"top": {"timestamps": {"new": now}}, "attempt": 0, "run": {}}
        if link is not None:
            info["link"] = list(link)
        runs = RunsRow(job, bytes([JobStatus.NEW.code]), bytes(4), {k: bytes(8) for k in TIME_KINDS})
        await self.repo.add_job(TopRow(job, name, JobStatus.NEW.value, spec, None, info, 0, now), runs)
        self.definitions.add(job, name, spec)
        self._added[job] = now  # the one time of its creation, stored and told to the state machine
        return job

    def given_state(self, sid: str, text: str) -> None:
        """A state the user handed in for the resubmission ``sid`` (``resubmit --from-state``)."""
        self._given[sid] = text

    # ------------------------------------------------------------ actors
    def capabilities(self, backend: str, settings: Mapping[str, Any]) -> Capabilities:
        return self.driver(backend).capabilities_for(settings)

    def driver(self, backend: str) -> Driver:
        return self.drivers.get(backend)

    async def actor(self, backend: str) -> Actor:
        actor = self._actors.get(backend)
        if actor is not None:
            return actor
        assert self.tg is not None
        driver = self.driver(backend)
        context = driver.context
        log = context.log
        concurrency = int(self.config.core["emulated_bulk_concurrency"])
        actor = Actor(backend, driver, post=self.answer, run_specs=self.definitions.run_specs,
                      prepare=self._prepare_runs, record_ids=self.writer.record_ids,
                      make_handle=self.definitions.run_handle, concurrency=concurrency, log=log,
                      chunk=int(self.config.core["submit_chunk"]), capacity=int(self.config.core["actor_mailbox"]),
                      confirm=self.repo.confirm_writer)
        monitor = Monitor(actor, post=self.post, status_of=self._status_of, read_ending=self._read_ending,
                          harvest=self._harvest, harvestable=self._harvestable,
                          poll_interval=float(self.config.core["poll_interval"]),
                          lost_after=float(self.config.core["lost_after_seconds"]), concurrency=concurrency, log=log)

        async def report(updates: Sequence[Any]) -> None:
            await monitor.receive(updates)

        context.report = report
        self._actors[backend], self._monitors[backend] = actor, monitor
        for loop in (actor.run, driver.serve, monitor.poll_forever):
            self.tg.start_soon(_detached, loop)
        return actor

    def metrics(self) -> dict[str, Any]:
        """Counters of the runtime and of each backend (its driver's own, the ticks it was polled, the runs
        it holds): what monitoring shows, and what tests read instead of reaching inside."""
        backends = {}
        for name, driver in self.drivers.items():
            monitor = self._monitors.get(name)
            actor = self._actors.get(name)
            backends[name] = {"driver": driver.metrics(), "ticks": monitor.ticks if monitor else 0,
                              "held": len(actor.held) if actor else 0, "queued": actor.queued if actor else 0,
                              "faults": dict(actor.faults.counts) if actor else {}}
        return {"events": self.bus.handled, "jobs": len(self.sm.job_ids()), "backends": backends,
                "work_waiting": self.executor.waiting_work}

    async def refresh(self) -> None:
        """Ask every polled backend once, now (the CLI without a service, before a listing)."""
        if self.readonly:
            return  # the process that holds the home watches its backends
        for monitor in list(self._monitors.values()):
            await monitor.poll()

    def _status_of(self, key: RunKey) -> JobStatus | None:
        return self.sm.status_if_known((key[0],) if key[1] is None else (key[0], key[1]))

    async def _prepare_runs(self, job: int, runs: Sequence[Any], start: str, given: str | None
                            ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        if start != "given" and self._harvestable(job) == []:  # no steps, no state saved: nothing to start from
            return {}, {}
        return await self.checkpoints.prepare(runs, start, given)

    def _read_ending(self, handle: RunHandle) -> Ending:
        ending = read_ending(handle)
        # Every run's: a job without steps may have saved states (one failed open when it saved none).
        ending.state = self.checkpoints.harvest(handle.fqid, handle.jobdir, final=True)
        return ending

    def _harvestable(self, job: int) -> Collection[int | None] | None:
        """The runs of ``job`` that may have saved states: all (``None``) when it has steps, else those that saved
        one already (a run of a job without steps is not concerned until then, :meth:`Checkpoints.concerned`)."""
        if self.definitions.spec(job).get("steps") is not None:
            return None
        saved = self.sm.checkpointed(job)
        return saved if self.sm.is_master(job) else [None] if saved else []

    def _harvest(self, handle: RunHandle) -> dict[str, Any] | None:
        """The states a running run saved since the last look (any run: the monitor chooses which to look at)."""
        return self.checkpoints.harvest(handle.fqid, handle.jobdir)

    # ------------------------------------------------------------ helpers for the pieces
    def _admit(self, job: int, spec: Mapping[str, Any], n: int) -> None:
        """The service's limits on ``job``'s ``n`` runs about to become active (:attr:`admission`)."""
        if self.admission is not None:
            self.admission(job, spec, n)

    def free_slots(self, backend: str) -> int:
        capacity = self.config.backend(backend).get("max_running")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            capacity = self.checkpoints.default_partitions
        actor = self._actors.get(backend)
        return max(capacity - (len(actor.held) if actor is not None else 0), 1)

    def _checkpoint_record(self, fqid: str) -> Mapping[str, Any]:
        return self.sm.checkpoint(tuple(int(p) for p in fqid.split(".")))

    def _spec_of_fqid(self, fqid: str) -> Mapping[str, Any]:
        fq = tuple(int(p) for p in fqid.split("."))
        if len(fq) == 1:
            return self.definitions.spec(fq[0])
        return self.definitions.subjob_spec(fq[0], fq[1])

    def _store_state(self, row: StateRow) -> None:
        self.writer.states.append(row)

    async def _forget(self, ins: Forget) -> None:
        await self.writer.flush()
        self.sm.forget(ins.job)
        self.definitions.forget(ins.job)
        for actor in self._actors.values():
            actor.release_job(ins.job)
        with anyio.CancelScope(shield=True):
            await self.repo.remove_job(ins.job)
        self.workspace.remove((ins.job,))

    def _adjust(self, ins: AdjustRun) -> None:
        """An action-table rule retries runs with other settings: more memory, more time, or elsewhere."""
        job = ins.runs.job
        master = self.sm.is_master(job)
        for i in ins.runs.indexes if ins.runs.indexes is not None else [None]:
            spec = self.definitions.subjob_spec(job, i) if i is not None else self.definitions.spec(job)
            settings = spec["backend"].get("settings", {})
            if ins.setting is not None:
                try:
                    values = {ins.setting: scaled(ins.setting, settings.get(ins.setting), ins.factor, ins.cap)}
                except ValueError as exc:  # a value the job set that is not Slurm's form: left as it is
                    self.log.warning("rule could not change the setting", rule=ins.rule, setting=ins.setting,
                                     error=str(exc))
                    continue
            else:
                values = dict(ins.values)
            self.definitions.set_run_settings(job, i if master else None, values)
            self.log.info("rule changed the run's settings", rule=ins.rule, fqid=f"{job}.{i}" if i is not None
                          else str(job), changed={k: f"{settings.get(k)} -> {v}" for k, v in values.items()})

    def _set_backend(self, ins: SetBackend) -> None:
        backend = ins.backend
        data = backend.to_dict() if hasattr(backend, "to_dict") else dict(backend)
        self.definitions.set_backend(ins.job, data, range(self.sm.n_subjobs(ins.job)))

    # ------------------------------------------------------------ waiting
    async def wait_until(self, done: Callable[[], bool], timeout: float | None) -> None:
        with anyio.fail_after(timeout if timeout is not None else math.inf):
            while not done():
                await self.bus.changed()
