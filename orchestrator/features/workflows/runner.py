"""``Workflows``: runs DØ workflows on an open orchestrator, package by package, as ordinary jobs.

    async with Orchestrator(home=...) as orch:
        async with Workflows(orch) as wfs:
            w = await wfs.submit(Workflow(...))
            await w.wait(timeout=600)

Each package becomes a top-level :class:`~orchestrator.Job` (``/bin/sh`` running
the package's generated script, see :mod:`.script`) on the package's backend
(``local`` by default), with the package's retry policy: the core's state
machine, drivers, wrapper and automatic retries do everything to it that
they do to any job. The runner only decides *when* each package is
submitted: a loop, woken by every step on the event bus, assesses
every workflow (:func:`.dag.assess`), kills what a killed line still has
running, disposes of files no consumer needs any more, and submits ready
packages by priority within the free slots (``[workflow] slots`` for the
home, ``Workflow.slots`` per workflow).

Workflows advance only while a ``Workflows`` is open: runs already at a
backend go on in between (the core finds them again), and on reopen the
runner reloads every workflow from ``workflows.sqlite``, finds its package
jobs by id, and carries on. Nest it inside the orchestrator's block.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio

from ...api.job import Job
from ...api.orchestrator import Orchestrator
from ...api.owners import Caller
from ...api.registry import JobRegistry
from ...api.validate import checked_backend
from ...core.errors import OrchestratorError, reraise_unwrapped
from ...core.model import Backend, Executable
from ...core.statuses import KILLABLE
from ...plugin.logs import get_logger
from .dag import Assessment, build, due_files
from .handle import WorkflowRun
from .model import Workflow
from .script import acquire, clear_markers, data_size, dispose
from .store import StoredPackage, WorkflowStore
from .values import WorkflowError

#: Seconds between two ticks when nothing happens (kills deferred, hold changes from elsewhere).
IDLE_TICK = 1.0
#: Seconds a burst of events is gathered into one tick.
DEBOUNCE = 0.02
DEFAULTS = {"slots": 0, "cache_limit": 0}


#: Seconds a stopping runner waits for a tick under way to finish its submissions.
STOP_WAIT = 10.0


class Workflows:
    """The workflows of one orchestrator home; ``autorun=False`` only reads and operates (no loop)."""

    def __init__(self, orch: Orchestrator, *, autorun: bool = True) -> None:
        self.orch = orch
        self.autorun = autorun
        self.root = orch.home / "workflows"
        self.store = WorkflowStore(orch.home / "workflows.sqlite")
        self.lock = anyio.Lock()
        self.ticked = anyio.Event()
        self._kicked = anyio.Event()
        self._runs: dict[str, WorkflowRun] = {}
        self._stack: AsyncExitStack | None = None
        self._closing = False
        self._evict_check = True
        self._completed_seen = -1
        self._registries: dict[str, JobRegistry] = {}
        self.log = get_logger(component="workflows")

    @property
    def running(self) -> bool:
        """The loop runs: workflows advance on their own."""
        return self.autorun and self._stack is not None and not self._closing

    @property
    def settings(self) -> dict[str, Any]:
        """``[workflow]`` of the configuration (``slots``, ``cache_limit``)."""
        return {**DEFAULTS, **self.orch.config.data.get("workflow", {})}

    # ------------------------------------------------------------- life
    async def __aenter__(self) -> Workflows:
        self.orch.runtime  # noqa: B018 - raises unless the home is open here (a service runs its own)
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            await self.store.open()
            stack.push_async_callback(self.store.close)
            await self._load()
            if self.autorun:
                tg = anyio.create_task_group()
                await stack.enter_async_context(tg)
                stack.callback(tg.cancel_scope.cancel)
                stack.push_async_callback(self._stop)
                tg.start_soon(self._loop)
                tg.start_soon(self._listen)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            await stack.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:  # the loop's task group wraps the body's own exception: it goes on
            reraise_unwrapped(group, exc)

    async def _stop(self) -> None:
        """Let a tick under way finish its submissions (shielded, at most ``STOP_WAIT`` s), then stop the loop.

        Shielded: a stop that comes with a cancellation (SIGTERM of the service) must not be cancelled while it
        waits for the lock, or the cancellation ends up as its own context and the shutdown never ends.
        """
        with anyio.move_on_after(STOP_WAIT, shield=True):
            async with self.lock:
                self._closing = True
        self._closing = True

    async def _load(self) -> None:
        by_name: dict[str, Job] | None = None
        for row in await self.store.load():
            spec = Workflow.from_dict(row.spec)
            dag = build(spec, exists=lambda f: True)  # checked at submission; disposal may have removed files
            run = WorkflowRun(self, spec, row.seq, dag, row.state, {k: row.packages.get(k, StoredPackage())
                                                                     for k in dag.nodes})
            for key, stored in run.stored.items():
                job = None
                if stored.job_id is not None:
                    job = self.orch.jobs.get(stored.job_id)
                    if job is None or job.name != _job_name(run.id, key):
                        run.record_error(key, f"its job {stored.job_id} is gone (removed?): restart it")
                        stored.job_id, job = None, None
                else:  # added, then the orchestrator stopped before the mapping was written
                    if by_name is None:
                        by_name = {j.name: j for j in self.orch.jobs}
                    job = by_name.get(_job_name(run.id, key))
                    stored.job_id = job.id if job is not None else None
                if job is not None:
                    run.jobs[key] = job
            changed = {k: p for k, p in run.stored.items() if p.job_id != row.packages.get(k, StoredPackage()).job_id
                       or p.state.get("error") != row.packages.get(k, StoredPackage()).state.get("error")}
            if changed:
                await self.store.save_packages(run.id, changed)
            run.snapshot = run.assess()
            self._runs[run.id] = run

    # --------------------------------------------------------------- access
    def __getitem__(self, wf_id: str) -> WorkflowRun:
        try:
            return self._runs[wf_id]
        except KeyError:
            raise KeyError(f"no workflow {wf_id!r}") from None

    def get(self, wf_id: str) -> WorkflowRun | None:
        return self._runs.get(wf_id)

    def __contains__(self, wf_id: object) -> bool:
        return wf_id in self._runs

    def __iter__(self) -> Any:
        return iter(list(self._runs.values()))

    def __len__(self) -> int:
        return len(self._runs)

    # --------------------------------------------------------------- submit
    async def submit(self, workflow: Workflow, owner: str | None = None) -> WorkflowRun:
        """Check, store and start a workflow; its ready packages are submitted before this returns.

        ``owner``: the user a service submits it for (its packages' jobs are that user's); ``None``: this
        orchestrator's user.

        Raises :class:`WorkflowError` (naming the file for a cycle or a missing
        producer, the field for a bad value) and leaves nothing behind.
        """
        spec = workflow.normalized()
        if spec.id is None:
            n = len(self._runs) + 1
            while f"wf{n}" in self._runs or (self.root / f"wf{n}").exists():
                n += 1
            spec.id = f"wf{n}"
        wf_id = spec.id
        if wf_id in self._runs:
            raise WorkflowError("a workflow with this id exists in this home", workflow=wf_id)
        user = owner is not None and owner != self.orch.user
        for key, _, _, p in spec.packages():
            for b in p.binaries:
                for f in b.inputs:
                    if user and f.acquisition == "prefetch":  # the service would read the file as itself
                        raise WorkflowError(f"package {key}: input {f.name!r}: prefetch is done by the service, "
                                            f"so a user's workflow may not ask for it: use acquisition = \"copy\" "
                                            f"(the package copies it, as its owner)", workflow=wf_id, file=f.name)
                    if f.locator is not None:
                        f.locator = os.path.abspath(os.path.expanduser(f.locator))
        datadir = self.root / wf_id / "data"
        dag = build(spec, exists=lambda f: Path(f.locator).exists() if f.locator else (datadir / f.name).exists())
        self._check_backends(spec)
        async with self.lock:
            if wf_id in self._runs:  # submitted meanwhile
                raise WorkflowError("a workflow with this id exists in this home", workflow=wf_id)
            fresh = not (self.root / wf_id).exists()
            datadir.mkdir(parents=True, exist_ok=True)
            try:
                for spec_file in dag.external.values():
                    if spec_file.acquisition == "prefetch":
                        acquire(spec_file, datadir)
            except OSError as exc:
                if fresh:
                    shutil.rmtree(self.root / wf_id, ignore_errors=True)
                raise WorkflowError(f"prefetch of {spec_file.name!r} failed: {exc}", workflow=wf_id,
                                    file=spec_file.name) from None
            state = {"hold": spec.hold, "dropped": [], "deleted": {}, "evictable": {}, "evicted": {}}
            if owner is not None and owner != self.orch.user:
                state["owner"] = owner
            packages = {key: StoredPackage(None, {"hold": p.hold}) for key, _, _, p in spec.packages()}
            seq = await self.store.add(wf_id, spec.to_dict(), state, packages)
            run = WorkflowRun(self, spec, seq, dag, state, packages)
            self._runs[wf_id] = run
            run.log.info("workflow submitted", packages=len(dag.nodes), files=len(dag.producer))
            await self.tick_locked()
        return run

    def _check_backends(self, spec: Workflow) -> None:
        here = {"localhost", socket.gethostname(), socket.getfqdn()}
        for key, _, _, p in spec.packages():
            backend = p.backend or spec.backend
            try:
                checked = checked_backend(backend, f"{spec.id}/{key}")
            except OrchestratorError as exc:
                raise WorkflowError(f"package {key}: {exc}", workflow=spec.id) from None
            if checked.name == "local" and p.nodes and not here & set(p.nodes):
                raise WorkflowError(f"package {key}: its node restriction list ({', '.join(p.nodes)}) does not name "
                                    f"this host ({socket.gethostname()}) or localhost, and the backend is local",
                                    workflow=spec.id)

    # ---------------------------------------------------------------- loop
    def kick(self) -> None:
        """Ask for a tick soon."""
        self._kicked.set()

    async def _listen(self) -> None:
        """Every step on the bus wakes the loop (a subscription dropped for lagging is renewed)."""
        while not self._closing:
            try:
                async for _ in self.orch.events():
                    self.kick()
            except Exception as exc:  # dropped for lagging: subscribe again
                self.log.info("event stream renewed", reason=str(exc))

    async def _loop(self) -> None:
        while True:
            self._kicked = anyio.Event()
            await self.tick()
            with anyio.move_on_after(IDLE_TICK):
                await self._kicked.wait()
            await anyio.sleep(DEBOUNCE)

    async def tick(self) -> None:
        """Assess every workflow, act on it, start what may start."""
        async with self.lock:
            if not self._closing:
                await self.tick_locked()

    async def tick_locked(self) -> None:
        """One tick; the caller holds :attr:`lock`."""
        assessed: list[tuple[WorkflowRun, Assessment]] = []
        for run in self._runs.values():
            a = run.assess()
            if any(run.stored[k].state.get("killed") and a.states[k] in KILLABLE for k in a.states):
                await run.kill_jobs([k for k in a.states if run.stored[k].state.get("killed")])
                a = run.assess()
            await self._dispose(run, a)
            assessed.append((run, a))
        completed = sum(1 for _, a in assessed for s in a.states.values() if s == "completed")
        if completed != self._completed_seen:  # new files may have filled the cache
            self._completed_seen, self._evict_check = completed, True
        await self._evict()
        await self._start_ready(assessed)
        for run in self._runs.values():
            final = run.assess()
            if final.status != "running":  # a package that ended during this tick: its files go before anyone
                await self._dispose(run, final)  # is told the workflow is over (``wait``)
            run.snapshot = final
        self.ticked.set()
        self.ticked = anyio.Event()

    async def _start_ready(self, assessed: list[tuple[WorkflowRun, Assessment]]) -> None:
        """Ready packages by workflow priority, package priority, critical path, submission order."""
        limit = int(self.settings["slots"])
        total = sum(a.active for _, a in assessed)
        per = {run.id: a.active for run, a in assessed}
        ready = [(run, key) for run, a in assessed if not run.hold_flag for key in a.ready]
        ready.sort(key=lambda rk: (-rk[0].spec.priority, -rk[0].dag.nodes[rk[1]].priority, -rk[0].levels[rk[1]],
                                   rk[0].seq, rk[0].dag.nodes[rk[1]].index))
        for run, key in ready:
            if limit and total >= limit:
                break
            if run.spec.slots and per[run.id] >= run.spec.slots:
                continue
            if await self._start(run, key):
                total += 1
                per[run.id] += 1

    async def _start(self, run: WorkflowRun, key: str) -> bool:
        """Write the package's script (which acquires its inputs on the worker), add its job (once), submit it."""
        _, _, pkg = run.where(key)
        stored = run.stored[key]
        try:
            job = run.jobs.get(key)
            if job is None:
                clear_markers(run.package_dir(key))
                script = run.write_script(key)
                backend = pkg.backend or run.spec.backend
                job = await self._jobs_of(run.owner).add(Job(
                    name=_job_name(run.id, key), application=Executable("/bin/sh", args=[str(script)]),
                    backend=backend.copy() if isinstance(backend, Backend) else backend,
                    retry=(pkg.retry or run.spec.retry or None)))
                run.jobs[key], stored.job_id = job, job.id
                await self.store.save_packages(run.id, {key: stored})
            else:
                run.write_script(key)
            with anyio.CancelScope(shield=True):
                await job.submit()
        except (OSError, OrchestratorError) as exc:
            run.record_error(key, f"could not start: {exc}")
            await self.store.save_packages(run.id, {key: stored})
            return False
        run.log.info("package started", package=key, job=job.id)
        return True

    def _jobs_of(self, owner: str | None) -> JobRegistry:
        """Where a workflow's package jobs are added: as its owner (a service's user), else as this orchestrator."""
        if owner is None:
            return self.orch.jobs
        registry = self._registries.get(owner)
        if registry is None:
            as_caller = getattr(self.orch.transport, "as_caller", None)
            if as_caller is None:  # a workflow with an owner advances only in a service (whose transport is here)
                raise OrchestratorError(f"workflow packages of {owner} are added by the service only")
            registry = self._registries[owner] = JobRegistry(as_caller(Caller(owner)))
        return registry

    # ---------------------------------------------------------- dispositions
    async def _dispose(self, run: WorkflowRun, a: Assessment) -> None:
        """Files every consumer has finished with: ``deletable`` ones go, ``temporary`` ones become evictable."""
        state, now, changed = run.state, time.time(), False
        for name, disposition in due_files(run.dag, a.states, run.dropped):
            if name in state["deleted"] or name in state["evictable"] or disposition == "retain":
                continue
            if disposition == "deletable":
                dispose(run.datadir, name)
                state["deleted"][name] = now
            else:
                state["evictable"][name] = now
                self._evict_check = True
            changed = True
        if changed:
            await self.store.save_state(run.id, state)

    async def _evict(self) -> None:
        """Over ``cache_limit`` bytes of data dirs: delete evictable temporary files, oldest first."""
        limit = int(self.settings["cache_limit"])
        if not limit or not self._evict_check:
            return
        self._evict_check = False
        pending = sorted((t, run.id, name) for run in self._runs.values()
                         for name, t in run.state["evictable"].items() if name not in run.state["evicted"])
        if not pending:
            return
        total = sum(data_size(run.datadir) for run in self._runs.values())
        touched: set[str] = set()
        for _, wf_id, name in pending:
            if total <= limit:
                break
            run = self._runs[wf_id]
            path = run.file(name)
            size = path.stat().st_size if path.is_file() and not path.is_symlink() else 0
            dispose(run.datadir, name)
            run.state["evicted"][name] = time.time()
            total -= size
            touched.add(wf_id)
            run.log.info("temporary file evicted", file=name, bytes=size)
        for wf_id in touched:
            await self.store.save_state(wf_id, self._runs[wf_id].state)





def _job_name(wf_id: str, key: str) -> str:
    """The package job's name; also how a job added just before a crash is found again."""
    return f"{wf_id}/{key}"

