"""The engine: carries out what the state machine decides.

It owns the state machine, the repository, the drivers and the bus. It
applies each :class:`~orchestrator.statemachine.Step` to the job objects,
keeps the set of runs to monitor, writes changes to the repository in
batches (one transaction per tick), runs mergers, and runs the monitoring
loop: one status query per backend per tick, whatever the number of runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup

from .bus import EventBus
from .config import Config
from .drivers import Driver, DriverContext, RunHandle, StatusUpdate
from .events import StatusChanged, StatusReport
from .ids import FQID, fqid_str, parse_fqid_or_none
from .job import Job
from .logs import get_logger
from .plugins import driver_class
from .reconcile import Reconciler
from .recovery import ENDINGS, BackendHealth, judge
from .repository import JobRow, Repository
from .statemachine import StateMachine, Step
from .status import ACTIVE, FINAL, MONITORED, JobStatus
from .workspace import Workspace

S = JobStatus
_REFUSED_KEPT = 20


class Engine:
    def __init__(self, home: Path, config: Config, repo: Repository, home_key: str) -> None:
        from .checkpointing import Checkpoints
        from .operations import Operations
        from .partition import Partitions

        self.home = home
        self.config = config
        self.repo = repo
        self.home_key = home_key
        self.workspace = Workspace(home / "workspace")
        self.sm = StateMachine(config.core["master_status_order"])
        self.bus = EventBus()
        self.ops = Operations(self)
        self.log = get_logger(home=str(home))
        self.jobs: dict[int, Job] = {}
        #: backend name -> fqid -> handle, for every run being monitored.
        self.active: dict[str, dict[FQID, RunHandle]] = {}
        self.drivers: dict[str, Driver] = {}
        self.postprocessing: set[int] = set()
        #: Automatic resubmissions under way.
        self.retrying = 0
        self._dirty: dict[FQID, Job] = {}
        self._spec_dirty: set[FQID] = set()
        self._changed = anyio.Event()
        self._flush_lock = anyio.Lock()
        self._tick_lock = anyio.Lock()
        self._locks: dict[int, anyio.Lock] = {}
        self._tg: TaskGroup | None = None
        self.health = BackendHealth(float(config.core["lost_after_seconds"]), float(config.core["poll_interval"]))
        #: Saved states: harvest, restore, resume (DataGrid checkpointing).
        self.checkpoints = Checkpoints(self)
        #: Pre-jobs and aggregators of partitioned jobs.
        self.partitions = Partitions(self)
        #: Runs caught mid-submission by a crash, settled by key at their backends.
        self.reconciler = Reconciler(self)

    # ---------------------------------------------------------------- life
    async def start(self, tg: TaskGroup) -> None:
        """Load every top-level job, rebuild the runs to monitor, start the loops."""
        self._tg = tg
        now = time.time()
        due_merges: list[int] = []
        for row in await self.repo.load_toplevel():
            job = self._job_from_row(row, parent=None)
            self.jobs[row.id] = job
            if row.n_subjobs:
                m = row.master or {}
                self.sm.add_master(row.id, self.repo.load_statuses(row.id), first=m.get("first"),
                                   last=m.get("last"), postprocess_failed=m.get("postprocess_failed", False))
                self.sm.pin(row.id, None, now)
                if self._merge_due(job):
                    due_merges.append(row.id)
            else:
                self.sm.add_job(row.id, S(row.status))
        await self._recover(now)
        self.partitions.start()
        for master_id in due_merges:  # ended while no orchestrator was there to merge
            self._start_postprocess(master_id)
        tg.start_soon(self._monitor_loop)
        tg.start_soon(self._consume_reports)
        tg.start_soon(self._flush_loop)
        tg.start_soon(self.reconciler.run)

    async def _recover(self, now: float) -> None:
        """After a restart: runs caught mid-submission are reconciled by key; the rest are monitored."""
        interrupted: list[FQID] = []
        for job_id, job in self.jobs.items():
            if self.sm.is_master(job_id):  # subjob objects only for the few caught mid-submission
                interrupted += [s.fqid_tuple for s in self.materialize(job, self.sm.subjob_ids(job_id, [S.SUBMITTING]))]
                for idx, status, backend_id, backend in self.repo.load_runs(job_id,
                                                                            self.sm.subjob_ids(job_id, MONITORED)):
                    if backend_id is not None:
                        self.active.setdefault(backend["name"], {})[(job_id, idx)] = RunHandle(
                            f"{job_id}.{idx}", idx, backend_id, backend.get("settings", {}),
                            self.workspace.outputdir((job_id, idx)), S(status))
            elif job.status == S.SUBMITTING:
                interrupted.append((job_id,))
            elif job.status in MONITORED:
                self._watch(job)
        await self.reconciler.start(interrupted)
        await self.flush()

    async def close(self) -> None:
        with anyio.move_on_after(float(self.config.core["close_grace"])):  # retries, mergers under way finish
            await self.wait_for(lambda: not self.postprocessing and not self.retrying and not self.partitions.busy,
                                None)
        await self.flush()
        for driver in self.drivers.values():
            await driver.aclose()
        self.bus.close()

    # ------------------------------------------------------------- objects
    def _job_from_row(self, row: JobRow, parent: Job | None) -> Job:
        assert row.spec is not None, "a loaded row always has its definition"
        job = Job.from_spec(row.name, row.spec)
        job.id = row.idx if parent is not None else row.id
        job.parent = parent
        job.backend_id = row.backend_id
        from .model import JobInfo

        job.info = JobInfo.from_dict(row.info)
        job._engine = self
        return job

    def materialize(self, master: Job, indexes: Sequence[int]) -> list[Job]:
        """The subjobs at ``indexes``, built from the repository where needed (one query for many)."""
        assert master.id is not None
        built = master.subjobs._built
        missing = [i for i in indexes if i not in built]
        for row in self.repo.load_subjobs(master.id, missing):
            assert row.idx is not None
            built[row.idx] = self._job_from_row(row, parent=master)
        return [built[i] for i in indexes]

    def forget(self, fqids: Iterable[FQID]) -> None:
        """Jobs that are going away (a rollback, a removal): no monitoring, no pending write."""
        for fq in fqids:
            self._dirty.pop(fq, None)
            self._spec_dirty.discard(fq)
            for runs in self.active.values():
                runs.pop(fq, None)

    def lookup(self, fqid: FQID) -> Job:
        job = self.jobs[fqid[0]]
        for part in fqid[1:]:
            job = job.subjobs(part)
        return job

    def lock(self, job: Job) -> anyio.Lock:
        """One lock per top-level job: operations on a job and its subjobs are serialised."""
        top = job.fqid_tuple[0]
        return self._locks.setdefault(top, anyio.Lock())

    def row(self, job: Job, *, with_spec: bool = True) -> JobRow:
        fq = job.fqid_tuple
        spec = job.spec() if with_spec else None
        if len(fq) > 1:
            return JobRow(fq[0], fq[1], job.name, job.status.value, spec, job.backend_id, job.info.to_dict())
        master: dict[str, Any] | None = None
        n = 0
        if self.sm.is_master(fq[0]):
            state = self.sm.master(fq[0])
            master = {"first": state.first, "last": state.last, "postprocess_failed": state.postprocess_failed}
            n = len(state.statuses)
        return JobRow(fq[0], None, job.name, job.status.value, spec, job.backend_id, job.info.to_dict(), n, master)

    # ----------------------------------------------------------- applying
    def move(self, fqids: Iterable[FQID], status: JobStatus, now: float | None = None) -> Step:
        step = self.sm.move(fqids, status, time.time() if now is None else now)
        self.apply(step)
        return step

    def apply(self, step: Step) -> None:
        """Carry a step out on the objects; persistence follows at the next flush."""
        for ch in step.changes:
            job = self.lookup(ch.fqid)
            ts = job.info.timestamps
            ts[ch.new.value] = ch.time
            if ch.new in FINAL:
                ts["final"] = ch.time
            if ch.new == S.SUBMITTING:
                job.info.submit_counter += 1
            elif ch.old == S.SUBMITTING and ch.new == S.NEW:
                job.info.submit_counter -= 1  # rolled back: that submission never took place
            if ch.new in MONITORED and job.backend_id is not None:
                self._watch(job)
            elif ch.new not in MONITORED:
                self._unwatch(job)
            self._dirty[ch.fqid] = job
        for ref in step.refused:
            self.log.warning("transition refused", fqid=fqid_str(ref.fqid), old=ref.old.value, new=ref.new.value,
                             reason=ref.reason)
            if ref.fqid[0] in self.jobs:
                job = self.lookup(ref.fqid)
                note = f"{ref.old.value}->{ref.new.value}: {ref.reason}"
                job.info.refused = [*job.info.refused, note][-_REFUSED_KEPT:]
                self._dirty[ref.fqid] = job
        for mc in step.masters:
            master = self.jobs[mc.master]
            state = self.sm.master(mc.master)
            master.info.timestamps.update(state.first)
            master.info.timestamps.update(state.last)
            if mc.new in (S.SUBMITTING,) and state.pinned:
                master.info.timestamps[mc.new.value] = mc.time
            self._dirty[(mc.master,)] = master
            self.log.info("master status", fqid=str(mc.master), old=mc.old.value, new=mc.new.value)
        for master_id in step.ended:
            self._start_postprocess(master_id)
            self.partitions.master_ended(master_id)
        self.partitions.observe(step)
        self.checkpoints.observe(step)
        if step.changes or step.masters:
            self.bus.publish(StatusChanged(
                ids=tuple(c.fqid for c in step.changes) + tuple((m.master,) for m in step.masters),
                old=tuple(c.old for c in step.changes) + tuple(m.old for m in step.masters),
                new=tuple(c.new for c in step.changes) + tuple(m.new for m in step.masters),
                time=time.time(),
            ))
            self.notify()

    def mark_dirty(self, job: Job, *, spec: bool = False) -> None:
        self._dirty[job.fqid_tuple] = job
        if spec:
            self._spec_dirty.add(job.fqid_tuple)

    def notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> None:
        with anyio.fail_after(timeout if timeout is not None else math.inf):
            while not predicate():
                await self._changed.wait()

    def is_active(self, job: Job, include_postprocess: bool = False) -> bool:
        fq = job.fqid_tuple
        if len(fq) == 1 and self.sm.is_master(fq[0]):
            state = self.sm.master(fq[0])
            if state.pinned is not None and state.pinned in ACTIVE:
                return True
            if include_postprocess and (fq[0] in self.postprocessing or self.partitions.is_busy(fq[0])):
                return True
            return any(state.counts[s.code] for s in ACTIVE)
        return job.status in ACTIVE

    # ---------------------------------------------------------- monitoring
    def handle_of(self, job: Job) -> RunHandle:
        assert job.backend_id is not None
        fq = job.fqid_tuple
        return RunHandle(fqid=job.fqid, index=fq[-1] if len(fq) > 1 else 0, backend_id=job.backend_id,
                         settings=job.backend.settings, outputdir=self.workspace.outputdir(fq), status=job.status)

    def _watch(self, job: Job) -> None:
        if job.backend_id is not None:
            self.active.setdefault(job.backend.name, {})[job.fqid_tuple] = self.handle_of(job)

    def _unwatch(self, job: Job) -> None:
        runs = self.active.get(job.backend.name)
        if runs is not None:
            runs.pop(job.fqid_tuple, None)

    async def _monitor_loop(self) -> None:
        interval = float(self.config.core["poll_interval"])
        while True:
            await anyio.sleep(interval)
            async with self._tick_lock:
                await self.poll_once()

    async def stop_ticking(self, timeout: float) -> None:
        """Let the tick under way finish and apply its reports; start no other (a graceful stop)."""
        with anyio.move_on_after(timeout):
            await self._tick_lock.acquire()  # held until the loop is cancelled: no new tick begins
            while self.bus.reports.statistics().current_buffer_used:
                await anyio.sleep(0.01)

    async def refresh(self) -> None:
        """Ask every backend now and apply its answers before returning."""
        await self.poll_once(apply_now=True)

    async def poll_once(self, apply_now: bool = False) -> None:
        """One tick: one status query per backend with active runs.

        A query that raises, or a report that makes no sense, is the
        backend's fault, never the job's: it is logged with the job's fqid,
        the backend is asked again with backoff, and only a run that gets no
        intelligible answer for ``lost_after_seconds`` is counted lost.
        """
        now = time.time()
        async with anyio.create_task_group() as tg:  # a slow backend does not hold up the others
            for name, runs in list(self.active.items()):
                if runs and self.health.may_poll(name, now):
                    tg.start_soon(self._poll_backend, name, runs, now, apply_now)

    async def _poll_backend(self, name: str, runs: dict[FQID, RunHandle], now: float, apply_now: bool) -> None:
        handles = [
            h if h.status == self.sm.status(fq) else self.handle_of(self.lookup(fq)) for fq, h in runs.items()
        ]
        driver = await self.driver(name)
        try:
            updates = list(await self.ops.bulk.status(driver, handles))
        except Exception as exc:  # a driver fault is the backend's, never the job's
            self.log.warning("status query failed", backend=name, error=repr(exc),
                             fqid=",".join(sorted({str(fq[0]) for fq in runs})), runs=len(handles))
            lost = self.health.silent(name, list(runs), now, whole_backend=True)
            updates = [self._lost_update(fq, f"no answer from backend {name} ({exc!r})") for fq in lost]
        else:
            updates = self._sane(name, updates, now)
        await self.checkpoints.tick(driver, runs)  # saved states reach the repository every tick
        if updates and apply_now:
            self.apply_updates(updates, name)
        elif updates:
            self.bus.report(StatusReport(ids=(), backend=name, updates=tuple(updates)))

    def _lost_update(self, fq: FQID, reason: str) -> StatusUpdate:
        self.log.warning("run lost: no intelligible answer", fqid=fqid_str(fq), reason=reason)
        return StatusUpdate(fqid_str(fq), S.FAILED, reason=reason, backend_verdict="lost")

    def _sane(self, name: str, updates: list[StatusUpdate], now: float) -> list[StatusUpdate]:
        """Drop reports that make no sense (logged); runs without one count as silent."""
        runs = self.active.get(name, {})
        good, garbage = [], []
        for u in updates:
            fq = parse_fqid_or_none(getattr(u, "fqid", None))
            if fq is None or fq not in runs or not isinstance(u, StatusUpdate) or not isinstance(u.status, JobStatus):
                self.log.warning("unintelligible status report", backend=name, fqid=str(getattr(u, "fqid", "?")),
                                 report=repr(u)[:200])
                if fq is not None and fq in runs:
                    garbage.append(fq)
                continue
            good.append(u)
        self.health.answered(name, [fq for fq in runs if fq not in garbage])
        lost = self.health.silent(name, garbage, now, whole_backend=False) if garbage else []
        return good + [self._lost_update(fq, f"unintelligible answers from backend {name}") for fq in lost]

    async def _consume_reports(self) -> None:
        async for event in self.bus.reports:
            if isinstance(event, StatusReport):
                self.apply_updates(event.updates, event.backend)

    def apply_updates(self, updates: Sequence[StatusUpdate], backend: str = "") -> None:
        """Feed backend reports to the state machine, grouped by status (one step each).

        A run that ended is judged by the analyser first: it may complete,
        fail, be held, or fail and be resubmitted at once within its limits.
        """
        by_status: dict[JobStatus, list[FQID]] = {}
        retries: list[FQID] = []
        now = time.time()
        driver = self.drivers.get(backend)
        for u in updates:
            fq = parse_fqid_or_none(u.fqid)
            try:
                job = self.lookup(fq) if fq is not None else None
            except (KeyError, IndexError):
                job = None
            if job is None or fq is None:
                self.log.warning("report for an unknown job", fqid=u.fqid, status=str(u.status))
                continue
            if u.status == job.status and u.backend_verdict is None:
                continue
            status = u.status
            if status in ENDINGS or u.backend_verdict is not None:
                wrapper = driver.capabilities_for(job.backend.settings).runs_wrapper if driver else False
                if wrapper:
                    self.checkpoints.harvest(job)  # the states it saved last, before judging the run
                decision = judge(job, u, self.config.retry, wrapper=wrapper, now=now)
                status = decision.status
                retry = decision.retry
                if status == S.FAILED and self.checkpoints.checkpointable(job):
                    retry = self.checkpoints.resume(job, decision)
                if retry:
                    retries.append(fq)
                self._dirty[fq] = job
                if decision.status != S.COMPLETED:
                    self.log.info("run judged", fqid=job.fqid, level=decision.level, verdict=decision.verdict,
                                  reason=decision.reason, retry=decision.retry)
            by_status.setdefault(status, []).append(fq)
        for status in (S.RUNNING, S.COMPLETING, S.HELD, S.COMPLETED, S.FAILED, S.KILLED, S.SUBMITTED):
            if status in by_status:
                self.move(by_status[status], status, now)
        retries = [fq for fq in retries if self.sm.status(fq) == S.FAILED]
        if retries:
            self.move(retries, S.SUBMITTING, now)
            self._start_retries(retries)

    def _start_retries(self, fqids: list[FQID]) -> None:
        """Resubmit jobs already moved to ``submitting``; ``close()`` waits for it."""
        assert self._tg is not None
        self.retrying += 1

        async def run() -> None:
            try:
                await self.ops.submit_prepared(fqids)
            finally:
                self.retrying -= 1
                self.notify()

        self._tg.start_soon(run)

    async def driver(self, name: str) -> Driver:
        driver = self.drivers.get(name)
        if driver is None:
            cls = driver_class(name)
            statedir = self.home / "backends" / name
            statedir.mkdir(parents=True, exist_ok=True)
            context = DriverContext(home=self.home, config=self.config.backend(name), statedir=statedir,
                                    log=get_logger(backend=name))
            driver = cls(context)
            self.drivers[name] = driver
            assert self._tg is not None
            self._tg.start_soon(driver.serve)
        return driver

    # ---------------------------------------------------------- persistence
    async def flush(self) -> None:
        """Write every changed job in one transaction."""
        async with self._flush_lock:
            if not self._dirty and not self.checkpoints.pending:
                return
            dirty, self._dirty = self._dirty, {}
            spec_dirty, self._spec_dirty = self._spec_dirty, set()
            states, self.checkpoints.pending = self.checkpoints.pending, []
            rows = [self.row(job, with_spec=len(fq) == 1 or fq in spec_dirty) for fq, job in dirty.items()
                    if fq[0] in self.jobs]
            try:
                await self.repo.save(rows, [r for r in states if int(r.job.split(".")[0]) in self.jobs],
                                     self.checkpoints.keep)
            except BaseException:
                for fq, job in dirty.items():
                    self._dirty.setdefault(fq, job)
                self._spec_dirty |= spec_dirty
                self.checkpoints.pending[:0] = states
                raise

    async def _flush_loop(self) -> None:
        interval = float(self.config.core["flush_interval"])
        while True:
            await anyio.sleep(interval)
            await self.flush()

    # --------------------------------------------------------- mergers
    def _merge_due(self, master: Job) -> bool:
        """All subjobs ended after the last merge (or there was none)."""
        assert master.id is not None
        state = self.sm.master(master.id)
        if master.merger is None or not state.all_final():
            return False
        return master.info.timestamps.get("merged", 0.0) < state.last.get("final", 0.0)

    def _start_postprocess(self, master_id: int) -> None:
        master = self.jobs.get(master_id)
        if master is None or master.merger is None or self._tg is None:
            return
        self.postprocessing.add(master_id)
        self._tg.start_soon(self._postprocess, master)

    async def _postprocess(self, master: Job) -> None:
        assert master.id is not None and master.merger is not None
        mid = master.id
        try:
            state = self.sm.master(mid)
            subjobs = [(i, JobStatus.from_code(c), self.workspace.outputdir((mid, i)))
                       for i, c in enumerate(state.statuses)]
            try:
                reason = master.merger.merge(self.workspace.outputdir((mid,)), subjobs)
            except OSError as exc:
                reason = f"{type(master.merger).__name__}: {exc}"
            if reason is not None or not master.info.partition.get("failed"):
                master.info.reason = reason  # an aggregator's failure keeps its own reason
            master.info.timestamps["merged"] = time.time()
            failed = self.partitions.postprocess_failed(master, reason is not None)
            self.apply(self.sm.set_postprocess_failed(mid, failed, time.time()))
            self.mark_dirty(master)
            if reason:
                self.log.warning("merger failed", fqid=str(mid), reason=reason)
            await self.flush()
        finally:
            self.postprocessing.discard(mid)
            self.notify()
