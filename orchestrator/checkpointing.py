"""Checkpointing in the core: harvest the states jobs save, restore one before each run, resume after crashes.

Driver-independent. Every backend that uses the wrapper runs the job in its
working directory (``RunSpec.workdir``, the job's ``$ORCH_HOME``), where the
State API (:mod:`orchestrator.checkpoint`, ``$ORCH_STATE``) keeps
``.orch-state/``. Before each run the core writes the state the run starts
from into ``RunSpec.workdir/.orch-state``; on every monitoring tick (runs
that are running) and when a run ends (before the analyser judges it) it
reads the states saved since into the repository, which keeps the newest
``states_kept`` of each job.

Remote drivers (the hook): a backend whose runs happen on another machine
copies ``RunSpec.workdir/.orch-state`` to the worker's ``$ORCH_HOME`` with
the inputs, and copies the worker's back into that local directory with the
output, before it reports the run's end. For states saved while the run goes
on it declares ``Capabilities(remote_states=True)`` and implements
``Driver.fetch_states(handles, targets)``: called each tick with the running
runs' handles and the local directories to fill.

Which state a run starts from:

- the first submission, and a user's ``resubmit()``: the initial state (the
  job's steps, nothing done), stored as the job's newest state;
- ``resubmit(from_state=text)``: that state, stored as the job's newest;
- automatic retries and ``release()``: the newest saved state (resume).

A job that failed for a cause outside itself (levels orchestrator, backend,
batch, worker) is resumed whatever the retry limits say; a retry the limits
allow for any other cause resumes too. Either way the restarts from one same
state are counted, and past ``max_restarts_per_state`` the job fails with a
history entry saying so: a job that crashes right after each load stops.
Only jobs with ``steps`` or that saved a state are concerned; others get
no state file and no row.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .analyser import Decision
from .checkpoint import STATE_DIR, State, StateError, Steps, initial_text, relabel, write_state_dir
from .drivers import Driver, RunHandle
from .errors import ConfigError, JobError
from .ids import FQID
from .job import Job
from .repository import StateRow
from .statemachine import Step
from .status import JobStatus

if TYPE_CHECKING:
    from .engine import Engine

S = JobStatus
#: Levels at which a run failed for a cause outside itself (DESIGN.md, fault tolerance).
EXTERNAL = frozenset({"orchestrator", "backend", "batch", "worker"})
_RUNNING = frozenset({S.RUNNING, S.COMPLETING})
_SETTINGS = {"states_kept": 1, "max_state_size": 1, "max_restarts_per_state": 0, "default_partitions": 1}


@dataclass(slots=True)
class Prepared:
    """The state a run was given; ``new``: store it once the run is submitted."""

    job: Job
    seq: int
    text: str
    final: bool
    new: bool


class Checkpoints:
    """The engine's checkpoint keeper; see the module docstring."""

    def __init__(self, engine: Engine) -> None:
        self.e = engine
        settings: dict[str, Any] = dict(engine.config.data.get("checkpoint", {}))
        for key, least in _SETTINGS.items():
            value = settings.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"checkpoint.{key} must be an integer >= {least}, not {value!r}")
        self.keep: int = settings["states_kept"]
        self.max_size: int = settings["max_state_size"]
        self.max_restarts: int = settings["max_restarts_per_state"]
        self.default_partitions: int = settings["default_partitions"]
        #: Harvested or new states, written by the engine's next flush (with the jobs' rows).
        self.pending: list[StateRow] = []
        #: What a job's next run starts from when not the newest state: "initial" or a state's text.
        self._starts: dict[FQID, str] = {}
        #: Runs now running, kept up to date from the state machine's steps: a tick looks at
        #: these only, never at every run a backend has queued.
        self._running: set[FQID] = set()
        self._primed = False

    def env(self) -> dict[str, str]:
        """What the State API on the worker needs to know (exported through the run file)."""
        return {"ORCH_STATE_MAX": str(self.max_size), "ORCH_STATE_KEEP": str(self.keep)}

    @staticmethod
    def checkpointable(job: Job) -> bool:
        return job.steps is not None or "seq" in job.info.checkpoint

    # ------------------------------------------------------------ harvest
    def harvest(self, job: Job) -> bool:
        """Queue the states ``job`` saved since the last look (its work dir); True if there were any."""
        directory = self.e.workspace.workdir(job.fqid_tuple) / STATE_DIR
        try:
            current = int((directory / "current").read_text(encoding="ascii").strip())
        except (OSError, ValueError):
            return False
        cp = job.info.checkpoint
        known = int(cp.get("seq", -1))
        if current <= known:
            return False
        newest: State | None = None
        for seq in range(max(known + 1, current - self.keep + 1), current + 1):
            path = directory / f"{seq}.state"
            try:
                if path.is_symlink():
                    raise StateError(f"{path} is a symbolic link")
                text = path.read_text(encoding="utf-8", errors="replace")
                state = State.from_text(text, fqid=job.fqid)
            except OSError:
                continue  # pruned by the job meanwhile: newer ones follow
            except StateError as exc:
                self.e.log.warning("unreadable state", fqid=job.fqid, seq=seq, error=str(exc))
                continue
            if state.label != f"{job.fqid}:{seq}" or state.seq != seq:
                text = state.dump(f"{job.fqid}:{seq}", seq, state.time)
            self.pending.append(StateRow(job.fqid, seq, state.time or time.time(), state.final, text))
            newest = state
            cp.update(seq=seq, label=f"{job.fqid}:{seq}", final=state.final, time=state.time)
        if newest is None:
            return False
        self.e.mark_dirty(job)
        return True

    def observe(self, step: Step) -> None:
        for ch in step.changes:
            if ch.new in _RUNNING:
                self._running.add(ch.fqid)
            else:
                self._running.discard(ch.fqid)

    async def tick(self, driver: Driver, runs: Mapping[FQID, RunHandle]) -> None:
        """Harvest the running runs of one backend (after a remote driver fetched their states)."""
        first = next(iter(runs.values()), None)
        if first is None or not driver.capabilities_for(first.settings).runs_wrapper:
            return  # no wrapper, no states (sim): and no look at 100,000 runs per tick
        if not self._primed:  # after a reopen: runs already running made no step
            self._primed = True
            self._running |= {fq for backend in self.e.active.values() for fq in backend
                              if self.e.sm.status(fq) in _RUNNING}
        jobs = [j for j in (self.e.lookup(fq) for fq in self._running if fq in runs)
                if driver.capabilities_for(j.backend.settings).runs_wrapper]
        if not jobs:
            return
        if driver.capabilities_for(jobs[0].backend.settings).remote_states:
            handles: list[RunHandle] = [self.e.handle_of(j) for j in jobs]
            try:
                await driver.fetch_states(handles, [self.e.workspace.workdir(j.fqid_tuple) / STATE_DIR for j in jobs])
            except Exception as exc:  # a driver's fault: the states come at the run's end
                self.e.log.warning("fetching states failed", backend=driver.name, error=repr(exc))
        for job in jobs:
            self.harvest(job)

    # ------------------------------------------------------------ restore
    def mark_fresh(self, jobs: Sequence[Job]) -> None:
        """A user's resubmission: the next run starts from the initial state."""
        for job in jobs:
            if self.checkpointable(job):
                self._starts[job.fqid_tuple] = "initial"

    def adopt(self, job: Job, text: str) -> None:
        """The next run of ``job`` starts from state ``text`` (``resubmit --from-state``)."""
        try:
            State.from_text(text, fqid=job.fqid)
        except StateError as exc:
            raise JobError(f"not a state: {exc}", fqid=job.fqid, field="from_state") from None
        self._starts[job.fqid_tuple] = text

    def discard(self, jobs: Sequence[Job]) -> None:
        """Forget starting points an operation set but did not use (a refused or cut-short resubmission)."""
        for job in jobs:
            self._starts.pop(job.fqid_tuple, None)

    async def prepare(self, jobs: Sequence[Job]) -> tuple[list[Prepared], dict[FQID, str]]:
        """Write into each job's work dir the state its next run starts from.

        Returns what each run was given, and the runs whose state could not
        be written (with the error): those must not start.
        """
        todo = [j for j in jobs if self.checkpointable(j) or (self._starts and j.fqid_tuple in self._starts)]
        if not todo:
            return [], {}
        await self.e.flush()  # states harvested at the end of the last run reach the repository first
        now = time.time()
        prepared: list[Prepared] = []
        unready: dict[FQID, str] = {}
        for job in todo:
            cp = job.info.checkpoint
            start = self._starts.pop(job.fqid_tuple, "resume")
            seq: int | None = cp.get("seq")
            if start not in ("initial", "resume"):
                seq = 0 if seq is None else seq + 1
                text = relabel(start, job.fqid, seq, now)
                p = Prepared(job, seq, text, State.from_text(text).final, new=True)
            elif seq is None or (start == "initial" and seq != 0):
                seq = 0 if seq is None else seq + 1
                p = Prepared(job, seq, initial_text(job.fqid, job.steps, seq, now), False, new=True)
            elif seq == 0:
                p = Prepared(job, 0, initial_text(job.fqid, job.steps, 0, float(cp.get("time", now))), False,
                             new=False)
            else:
                row = await self.e.repo.state(job.fqid, seq)
                if row is None:
                    self.e.log.warning("newest state missing; starting from the initial state", fqid=job.fqid,
                                       seq=seq)
                    seq += 1
                    p = Prepared(job, seq, initial_text(job.fqid, job.steps, seq, now), False, new=True)
                else:
                    p = Prepared(job, seq, row.data, row.final, new=False)
            exported = await self._exports(job) if job.info.partition.get("role") == "aggregator" else None
            try:
                write_state_dir(self.e.workspace.workdir(job.fqid_tuple) / STATE_DIR, p.text, p.seq, exported)
            except OSError as exc:
                unready[job.fqid_tuple] = f"could not write its starting state: {exc}"
                continue
            prepared.append(p)
        return prepared, unready

    def commit(self, prepared: Sequence[Prepared], submitted: set[FQID]) -> None:
        """Store the new starting states of the runs that were submitted."""
        now = time.time()
        for p in prepared:
            if p.new and p.job.fqid_tuple in submitted:
                self.pending.append(StateRow(p.job.fqid, p.seq, now, p.final, p.text))
                p.job.info.checkpoint.update(seq=p.seq, label=f"{p.job.fqid}:{p.seq}", final=p.final, time=now)
                self.e.mark_dirty(p.job)

    async def _exports(self, job: Job) -> dict[str, str]:
        """The states an aggregator loads by label (its steps), from the repository."""
        out: dict[str, str] = {}
        for label in Steps(job.steps):
            fqid, _, seq = label.rpartition(":")
            row = await self.e.repo.state(fqid, int(seq)) if seq.isdigit() else None
            if row is not None:
                out[label] = row.data
        return out

    # ------------------------------------------------------------- resume
    def resume(self, job: Job, decision: Decision) -> bool:
        """Whether a failed run of a checkpointable job starts again from its newest state.

        Updates the restart counter and the history entry ``judge`` just
        wrote (``state``: the label resumed from; or ``limit``:
        ``max_restarts_per_state`` when the counter stops it).
        """
        external = decision.level in EXTERNAL and decision.verdict not in ("killed", "hold")
        if not (external or decision.retry):
            return False
        cp = job.info.checkpoint
        seq = int(cp.get("seq", 0))
        label = f"{job.fqid}:{seq}"
        if cp.get("restart_seq") == seq:
            cp["restarts"] = int(cp.get("restarts", 0)) + 1
        else:
            cp["restart_seq"], cp["restarts"] = seq, 1
        entry = job.info.history[-1] if job.info.history else {}
        base = decision.reason.split("; retry limit ")[0]
        if cp["restarts"] > self.max_restarts:
            why = (f"{base}; restarted {self.max_restarts} time(s) from state {label} without a new save: "
                   f"max_restarts_per_state={self.max_restarts} reached")
            job.info.reason = why
            entry.update(action="failed", reason=why, limit="max_restarts_per_state", state=label)
            return False
        entry.pop("limit", None)
        entry.update(action="retry", reason=base, state=label, restart=cp["restarts"])
        job.info.reason = f"{base}; resumed from state {label}"
        return True

    # ------------------------------------------------------------- reading
    async def stored(self, job: Job) -> list[StateRow]:
        """The job's states in the repository, oldest first."""
        await self.e.flush()
        return await self.e.repo.states(job.fqid)
