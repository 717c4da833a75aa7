"""``WorkflowRun``: one submitted workflow, as its user holds it (``w = await wfs.submit(wf)``).

It keeps the definition, the implied DAG, the package → job mapping and the
flags (hold, killed, dropped files), and offers the operations:
``wait``, ``kill_line``, ``release``, ``hold``, ``restart``, ``dagman``. Every
operation runs under the runner's lock (never in the middle of a tick),
persists its change before it returns, and then lets the runner tick once,
so that what it made possible (a consumer freed by a drop, a released
package) has started when it returns.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio

from ...api.job import Job
from ...core.analyser import Limits
from ...core.errors import JobError
from ...core.statuses import KILLABLE
from ...plugin.logs import get_logger
from .dag import Assessment, Dag, Facts, assess, bottom_levels
from .dagman import node_name, submit_description, to_dagman
from .model import Line, Package, Stage, Workflow
from .script import dispose, package_script, write_script
from .store import StoredPackage
from .values import WorkflowError


class Runner(Protocol):
    """What a workflow needs of the runner that advances it (:class:`~.runner.Workflows`)."""

    lock: anyio.Lock
    store: Any
    orch: Any
    root: Path
    ticked: anyio.Event

    @property
    def running(self) -> bool: ...

    def kick(self) -> None: ...
    async def tick_locked(self) -> None: ...

#: Package states from which a kill acts at once (others are retried at the next tick).
_HISTORY_KEPT = 50


@dataclass
class PackageView:
    """A package as it stands: its definition, state, job, and what it still waits for."""

    key: str
    stage: Stage
    line: Line
    spec: Package
    state: str
    job: Job | None
    waiting_for: list[str]
    hold: bool
    killed: bool
    parents: list[str]
    children: list[str]
    errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.state

    @property
    def history(self) -> list[dict[str, Any]]:
        """The failure history: the job's (every failed run) and the runner's (staging, submission)."""
        runs = list(self.job.info.history) if self.job is not None else []
        return sorted([*self.errors, *runs], key=lambda e: e.get("time", 0.0))


class WorkflowRun:
    """A submitted workflow. Build it through :meth:`Workflows.submit`, never directly."""

    def __init__(self, runner: Runner, spec: Workflow, seq: int, dag: Dag, state: dict[str, Any],
                 packages: dict[str, StoredPackage]) -> None:
        assert spec.id is not None
        self._runner = runner
        self.spec = spec
        self.id: str = spec.id
        self.seq = seq
        self.dag = dag
        #: ``hold``, ``dropped`` (list), ``deleted`` / ``evictable`` / ``evicted`` (file → time).
        self.state = state
        for key in ("deleted", "evictable", "evicted"):
            state.setdefault(key, {})
        state.setdefault("dropped", [])
        self.stored = packages
        self.jobs: dict[str, Job] = {}
        self.snapshot: Assessment | None = None
        self.levels = bottom_levels(dag)
        self._where = {key: (s, ln, p) for key, s, ln, p in spec.packages()}
        self.log = get_logger(workflow=self.id)

    # ------------------------------------------------------------ places
    @property
    def dir(self) -> Path:
        return self._runner.root / self.id

    @property
    def datadir(self) -> Path:
        """The shared data directory: every package reads its inputs and writes its outputs here."""
        return self.dir / "data"

    def package_dir(self, key: str) -> Path:
        """The package's script and its per-binary markers."""
        return self.dir / "packages" / key

    def file(self, name: str) -> Path:
        return self.datadir / name

    # ------------------------------------------------------------- state
    @property
    def dropped(self) -> set[str]:
        return set(self.state["dropped"])

    @property
    def hold_flag(self) -> bool:
        return bool(self.state.get("hold"))

    @property
    def owner(self) -> str | None:
        """The user who submitted it through a service (its packages' jobs are theirs); ``None``: the home's."""
        owner = self.state.get("owner")
        return str(owner) if owner else None

    def where(self, key: str) -> tuple[Stage, Line, Package]:
        return self._where[key]

    def facts(self) -> dict[str, Facts]:
        out = {}
        for key in self.dag.nodes:
            st = self.stored[key].state
            job = self.jobs.get(key)
            out[key] = Facts(job.status.value if job is not None else None, bool(st.get("hold")),
                             bool(st.get("killed")), st.get("error"))
        return out

    def assess(self) -> Assessment:
        return assess(self.dag, self.facts(), self.dropped, self.hold_flag)

    @property
    def status(self) -> str:
        """``running``, ``held``, ``failed``, ``blocked``, ``killed`` or ``completed`` (see :func:`.dag.assess`)."""
        return self.assess().status

    @property
    def packages(self) -> dict[str, PackageView]:
        a = self.assess()
        dropped = self.dropped
        out = {}
        for key in self.dag.nodes:
            s, ln, p = self._where[key]
            st = self.stored[key].state
            out[key] = PackageView(key, s, ln, p, a.states[key], self.jobs.get(key), a.waiting_for.get(key, []),
                                   bool(st.get("hold")), bool(st.get("killed")), list(self.dag.parents(key, dropped)),
                                   self.dag.children(key, dropped), list(st.get("history", [])))
        return out

    def record_error(self, key: str, reason: str) -> None:
        """The package could not be started: it is ``failed`` until :meth:`restart`."""
        st = self.stored[key].state
        st["error"] = reason
        st["history"] = [*st.get("history", []), {"time": time.time(), "level": "orchestrator",
                                                  "verdict": "not started", "reason": reason}][-_HISTORY_KEPT:]
        self.log.warning("package not started", package=key, reason=reason)

    def __repr__(self) -> str:
        return f"<WorkflowRun {self.id} {self.status} ({len(self.dag.nodes)} packages)>"

    # -------------------------------------------------------- operations
    async def wait(self, timeout: float | None = None) -> str:
        """Return the status once the workflow needs nobody but the user: anything but ``running``.

        Reads the runner's last tick, so that whatever that tick did (files
        disposed of) is done when this returns. ``TimeoutError`` after ``timeout``.
        """
        runner = self._runner
        if not runner.running:
            raise WorkflowError("no runner advances it (Workflows closed, or opened with autorun=False)",
                                workflow=self.id)
        with anyio.fail_after(math.inf if timeout is None else timeout):
            while True:
                ticked = runner.ticked
                if self.snapshot is not None and self.snapshot.status != "running":
                    return self.snapshot.status
                await ticked.wait()

    async def kill_line(self, stage: str | int, line: str | int, drop_outputs: bool = False) -> list[str]:
        """Kill every package of a line that has not completed; return their keys.

        Without ``drop_outputs`` their consumers keep waiting for the files (the
        workflow ends ``blocked``); with it, those files are removed from every
        downstream input list (and from the data dir, if a killed run left part
        of one), and consumers waiting only for them start without them.
        """
        keys = self.dag.line(str(stage), str(line))
        if not keys:
            raise WorkflowError(f"has no line {stage}.{line}", workflow=self.id)
        async with self._runner.lock:
            states = self.assess().states
            killed = [k for k in keys if states[k] != "completed"]
            for key in killed:
                self.stored[key].state["killed"] = True
            await self._runner.store.save_packages(self.id, {k: self.stored[k] for k in killed})
            await self.kill_jobs(killed)
            if drop_outputs:
                new = [n for k in killed for n in self.dag.nodes[k].outputs if n not in self.dropped]
                self.state["dropped"] = [*self.state["dropped"], *new]
                for name in new:
                    dispose(self.datadir, name)
                await self._runner.store.save_state(self.id, self.state)
            self.log.info("line killed", line=f"{stage}.{line}", packages=killed, drop_outputs=drop_outputs)
            await self._runner.tick_locked()
        return killed

    async def kill_jobs(self, keys: list[str]) -> None:
        """Kill the jobs of killed packages that are at a backend; a refusal waits for the next tick."""
        for key in keys:
            job = self.jobs.get(key)
            if job is not None and job.status.value in KILLABLE:
                try:
                    await job.kill()
                except JobError as exc:
                    self.log.info("kill deferred", package=key, reason=str(exc))

    async def release(self, package: str | None = None) -> None:
        """Release the workflow (``package=None``: and every held package and held job) or one package."""
        async with self._runner.lock:
            keys = list(self.dag.nodes) if package is None else [self._key(package)]
            if package is None:
                self.state["hold"] = False
                await self._runner.store.save_state(self.id, self.state)
            for key in keys:
                self.stored[key].state["hold"] = False
            await self._runner.store.save_packages(self.id, {k: self.stored[k] for k in keys})
            for key in keys:
                job = self.jobs.get(key)
                if job is not None and job.status == "held":
                    await job.release()
            await self._runner.tick_locked()

    async def hold(self, package: str | None = None) -> None:
        """Hold the workflow or one package: nothing more of it starts (what runs goes on)."""
        async with self._runner.lock:
            if package is None:
                self.state["hold"] = True
                await self._runner.store.save_state(self.id, self.state)
            else:
                key = self._key(package)
                self.stored[key].state["hold"] = True
                await self._runner.store.save_packages(self.id, {key: self.stored[key]})
            self._runner.kick()

    async def restart(self, package: str) -> None:
        """Start a failed or killed package again (DØ: back to "unscheduled"); it resumes at its first
        unfinished binary. Files dropped by a kill stay dropped."""
        key = self._key(package)
        async with self._runner.lock:
            state = self.assess().states[key]
            if state not in ("failed", "killed"):
                raise WorkflowError(f"package {key} is {state}: only a failed or killed package restarts",
                                    workflow=self.id)
            st = self.stored[key].state
            st["killed"], st["error"] = False, None
            await self._runner.store.save_packages(self.id, {key: self.stored[key]})
            job = self.jobs.get(key)
            if job is not None and job.status.value in ("failed", "killed"):
                self.write_script(key)
                await job.resubmit(only_failed=False)
            await self._runner.tick_locked()

    def _key(self, package: str) -> str:
        if package not in self.dag.nodes:
            raise WorkflowError(f"has no package {package!r} (keys are STAGE.LINE.PACKAGE)", workflow=self.id)
        return package

    # ----------------------------------------------------------- scripts
    def script_path(self, key: str) -> Path:
        return self.package_dir(key) / "run.sh"

    def write_script(self, key: str, path: Path | None = None) -> Path:
        path = path or self.script_path(key)
        text = package_script(self._where[key][2], key, workflow=self.id, datadir=self.datadir,
                              markdir=self.package_dir(key), dropped=self.dropped, external=self.dag.external)
        write_script(path, text)
        return path

    # ------------------------------------------------------------ DAGMan
    def retries(self) -> dict[str, int]:
        """Per package, the most automatic retries its policy allows (the settings fill the gaps)."""
        defaults = self._runner.orch.config.retry
        out = {}
        for key in self.dag.nodes:
            policy = self._where[key][2].retry or self.spec.retry
            limits = Limits.resolve(policy.to_dict() if policy else {}, defaults)
            out[key] = limits.max_early + limits.max_late_handled + limits.max_late_unhandled
        return out

    def dagman(self) -> str:
        """The implied DAG as an HTCondor DAGMan file (completed packages marked DONE)."""
        done = [k for k, s in self.assess().states.items() if s == "completed"]
        return to_dagman(self.dag, workflow=self.id, dropped=self.dropped, retries=self.retries(), done=done,
                         slots=self.spec.slots)

    def write_dagman(self, path: str | Path) -> Path:
        """Write the DAG file and, next to it, a submit file and a script per package."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        for key in self.dag.nodes:
            node = node_name(key)
            script = self.write_script(key, path.parent / f"{node}.sh")
            pkg = self._where[key][2]
            (path.parent / f"{node}.sub").write_text(submit_description(
                script=str(script.resolve()), datadir=str(self.datadir), node=node, nodes=pkg.nodes,
                priority=pkg.priority))
        path.write_text(self.dagman())
        return path
