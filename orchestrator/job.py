"""``Job`` and the slices users hold: the public face of the job model.

A ``Job`` is plain data until ``orch.jobs.add()`` binds it to an
orchestrator; from then on its status is read from the state machine (never
stored on the object) and its operations are carried out by the engine.
Subjob objects are built on first access, so a master of 100,000 subjobs
costs a ``bytearray`` until someone looks.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import JobError
from .ids import FQID, fqid_str
from .mergers import Merger
from .model import Backend, Executable, JobInfo, RetryPolicy
from .splitters import Splitter
from .status import JobStatus, parse_status

if TYPE_CHECKING:
    from .engine import Engine


class Job:
    """A job: an application, its files, a splitter, a backend."""

    def __init__(
        self,
        name: str = "",
        application: Executable | None = None,
        inputfiles: Sequence[str] = (),
        outputfiles: Sequence[str] = (),
        splitter: Splitter | None = None,
        merger: Merger | None = None,
        backend: str | Backend = "local",
        retry: RetryPolicy | None = None,
        mode: str = "production",
        steps: str | Sequence[str | int] | None = None,
        step_weights: Sequence[float] | None = None,
        prejob: Job | None = None,
        aggregator: Job | None = None,
        min_success: float = 1.0,
    ) -> None:
        self.name = name
        self.application = application
        self.inputfiles = list(inputfiles)
        self.outputfiles = list(outputfiles)
        self.splitter = splitter
        self.merger = merger
        self.backend: Backend = backend if isinstance(backend, Backend) else Backend(backend)
        self.retry = retry or RetryPolicy()
        self.mode = mode
        #: DataGrid's JobSteps: ``"1..1000000"`` or a list of labels; each run's State steps through them.
        self.steps: str | list[Any] | None = steps if steps is None or isinstance(steps, str) else list(steps)
        self.step_weights: list[float] | None = list(step_weights) if step_weights is not None else None
        self._prejob = prejob
        self._aggregator = aggregator
        #: The fraction of subjobs that must reach a final state for the aggregator to start.
        self.min_success = min_success
        self.id: int | None = None
        self.parent: Job | None = None
        self.backend_id: str | None = None
        self.info = JobInfo()
        self._engine: Engine | None = None
        self._subjobs = SubjobList(self)

    # ------------------------------------------------------------ identity
    @property
    def fqid_tuple(self) -> FQID:
        if self.id is None:
            raise JobError("the job has not been added to an orchestrator yet", fqid="(new)")
        return (*self.parent.fqid_tuple, self.id) if self.parent is not None else (self.id,)

    @property
    def fqid(self) -> str:
        return fqid_str(self.fqid_tuple)

    @property
    def fqid_or_new(self) -> str:
        if self.id is None and self.parent is None:
            return f"(new {self.name or 'job'})"
        if self.id is None:
            return f"{self.parent.fqid_or_new}.?"  # type: ignore[union-attr]
        return self.fqid

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise JobError("the job has not been added to an orchestrator (await orch.jobs.add(job))",
                           fqid=self.fqid_or_new)
        return self._engine

    # ------------------------------------------------------------ state
    @property
    def status(self) -> JobStatus:
        if self._engine is None:
            return JobStatus.NEW
        return self._engine.sm.status(self.fqid_tuple)

    @property
    def subjobs(self) -> SubjobList:
        return self._subjobs

    @property
    def master(self) -> Job | None:
        """Ganga's name for ``parent``."""
        return self.parent

    @property
    def prejob(self) -> Job | None:
        """The pre-job: once submitted, the top-level job that runs it (else its definition)."""
        return self._linked("prejob") or self._prejob

    @prejob.setter
    def prejob(self, value: Job | None) -> None:
        self._prejob = value

    @property
    def aggregator(self) -> Job | None:
        """The aggregator: once started, the top-level job that runs it (else its definition)."""
        return self._linked("aggregator") or self._aggregator

    @aggregator.setter
    def aggregator(self, value: Job | None) -> None:
        self._aggregator = value

    def _linked(self, role: str) -> Job | None:
        job_id = self.info.partition.get(role) if self._engine is not None and self.parent is None else None
        return self._engine.jobs.get(job_id) if self._engine is not None and job_id is not None else None

    @property
    def workspace(self) -> Path:
        """This job's directory under the home: ``workspace/<id>`` or ``workspace/<id>/<i>``."""
        return self.engine.workspace.jobdir(self.fqid_tuple)

    @property
    def inputdir(self) -> Path:
        return self.engine.workspace.inputdir(self.fqid_tuple)

    @property
    def outputdir(self) -> Path:
        return self.engine.workspace.outputdir(self.fqid_tuple)

    def is_active(self) -> bool:
        """Something of this job is submitting, submitted, running or completing."""
        if self._engine is None:
            return False
        return self._engine.is_active(self)

    # --------------------------------------------------------- operations
    async def submit(self, keep_going: bool = False) -> None:
        await self.engine.ops.submit(self, keep_going=keep_going)

    async def kill(self, keep_going: bool = False) -> None:
        await self.engine.ops.kill([self], keep_going=keep_going)

    async def resubmit(self, only_failed: bool = True, backend: str | Backend | None = None,
                       keep_going: bool = False, from_state: str | None = None) -> None:
        """Run again. ``from_state``: the text of a saved state (``orchestrator checkpoint get``) to start from."""
        await self.engine.ops.resubmit_job(self, only_failed=only_failed, backend=backend, keep_going=keep_going,
                                           from_state=from_state)

    async def release(self, retry_args: Sequence[str] | None = None) -> None:
        """Resume a held job; ``retry_args`` reach it as ``ORCH_RETRY_ARG_1..n``."""
        await self.engine.ops.release(self, retry_args)

    async def copy(self) -> Job:
        return await self.engine.ops.copy(self)

    async def remove(self) -> None:
        await self.engine.ops.remove(self)

    async def wait(self, timeout: float | None = None) -> None:
        await self.engine.wait_for(lambda: not self.engine.is_active(self, include_postprocess=True), timeout)

    # ---------------------------------------------------------- templates
    def template(self) -> Job:
        """A detached copy of the runnable parts, for a splitter or ``copy()``."""
        twin = Job(
            name=self.name,
            application=self.application.copy() if self.application is not None else None,
            inputfiles=list(self.inputfiles),
            outputfiles=list(self.outputfiles),
            backend=self.backend.copy(),
            retry=self.retry.copy(),
            mode=self.mode,
            steps=self.steps,
        )
        return twin

    def spec(self) -> dict[str, Any]:
        """What the repository stores of the job's definition."""
        from .plugins import dump_plugin

        return {
            "application": self.application.to_dict() if self.application else None,
            "inputfiles": list(self.inputfiles),
            "outputfiles": list(self.outputfiles),
            "backend": self.backend.to_dict(),
            "retry": self.retry.to_dict(),
            "mode": self.mode,
            "splitter": dump_plugin(self.splitter),
            "merger": dump_plugin(self.merger),
            **self._partition_spec(),
        }

    def _partition_spec(self) -> dict[str, Any]:
        """Steps, weights, pre-job and aggregator, stored only when set (most jobs have none)."""
        spec: dict[str, Any] = {}
        if self.steps is not None:
            spec["steps"] = self.steps if isinstance(self.steps, str) else list(self.steps)
        if self.step_weights is not None:
            spec["step_weights"] = list(self.step_weights)
        for role, job in (("prejob", self._prejob), ("aggregator", self._aggregator)):
            if job is not None:
                spec[role] = {"name": job.name, "spec": job.spec()}
        if self.min_success != 1.0:
            spec["min_success"] = self.min_success
        return spec

    @classmethod
    def from_spec(cls, name: str, spec: dict[str, Any]) -> Job:
        from .plugins import load_merger, load_splitter

        app = spec.get("application")
        return cls(
            name=name,
            application=Executable.from_dict(app) if app else None,
            inputfiles=spec.get("inputfiles", []),
            outputfiles=spec.get("outputfiles", []),
            splitter=load_splitter(spec.get("splitter")),
            merger=load_merger(spec.get("merger")),
            backend=Backend.from_dict(spec["backend"]),
            retry=RetryPolicy.from_dict(spec.get("retry")),
            mode=spec.get("mode", "production"),
            steps=spec.get("steps"),
            step_weights=spec.get("step_weights"),
            prejob=cls.from_spec(spec["prejob"]["name"], spec["prejob"]["spec"]) if spec.get("prejob") else None,
            aggregator=(cls.from_spec(spec["aggregator"]["name"], spec["aggregator"]["spec"])
                        if spec.get("aggregator") else None),
            min_success=spec.get("min_success", 1.0),
        )

    def __repr__(self) -> str:
        ident = self.fqid if self.id is not None else "new"
        return f"<Job {ident} {self.name!r} {self.status.value} on {self.backend.name}>"


def _matches(job: Job, status: set[JobStatus] | None, name: str | None) -> bool:
    if status is not None and job.status not in status:
        return False
    return name is None or fnmatch.fnmatchcase(job.name, name)


def _status_set(status: str | JobStatus | Sequence[str | JobStatus] | None) -> set[JobStatus] | None:
    if status is None:
        return None
    if isinstance(status, str):
        return {parse_status(status)}
    return {parse_status(s) for s in status}


class JobSlice:
    """A list of jobs with collective operations (``kill``, ``resubmit``)."""

    def __init__(self, jobs: Sequence[Job]) -> None:
        self._jobs = list(jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self._jobs)

    def __getitem__(self, i: int) -> Job:
        return self._jobs[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (JobSlice, SubjobList, list, tuple)):
            return len(self) == len(other) and all(a is b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __repr__(self) -> str:
        return f"JobSlice({self._jobs!r})"

    def select(self, status: Any = None, name: str | None = None) -> JobSlice:
        wanted = _status_set(status)
        return JobSlice([j for j in self._jobs if _matches(j, wanted, name)])

    async def kill(self, keep_going: bool = False) -> None:
        if self._jobs:
            await self._jobs[0].engine.ops.kill(self._jobs, keep_going=keep_going)

    async def resubmit(self, keep_going: bool = False, backend: str | Backend | None = None) -> None:
        if self._jobs:
            await self._jobs[0].engine.ops.resubmit(self._jobs, keep_going=keep_going, backend=backend)


class SubjobList:
    """A master's subjobs: ``j.subjobs[i]``, ``j.subjobs(i)``, ``select()``, ``len()``.

    Subjob objects are built on first access and then kept, so the same
    index always gives the same object.
    """

    def __init__(self, master: Job) -> None:
        self._master = master
        self._built: dict[int, Job] = {}

    def __len__(self) -> int:
        m = self._master
        if m._engine is None or m.id is None or m.parent is not None or not m._engine.sm.is_master(m.id):
            return 0
        return len(m._engine.sm.master(m.id).statuses)

    def _get(self, index: int) -> Job:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"job {self._master.fqid_or_new} has no subjob {index} (it has {n})")
        job = self._built.get(index)
        if job is None:
            self._master.engine.materialize(self._master, [index])
            job = self._built[index]
        return job

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            wanted = range(len(self))[index]
            missing = [i for i in wanted if i not in self._built]
            if missing:  # one repository query for the whole slice
                self._master.engine.materialize(self._master, missing)
            return JobSlice([self._built[i] for i in wanted])
        return self._get(index)

    def __call__(self, index: int) -> Job:
        return self._get(index)

    def __iter__(self) -> Iterator[Job]:
        n = len(self)
        missing = [i for i in range(n) if i not in self._built]
        if missing:
            self._master.engine.materialize(self._master, missing)
        return (self._built[i] for i in range(n))

    def __bool__(self) -> bool:
        return len(self) > 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (JobSlice, SubjobList, list, tuple)):
            return len(self) == len(other) and all(a is b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __repr__(self) -> str:
        return f"<{len(self)} subjobs of job {self._master.fqid_or_new}>"

    def select(self, status: Any = None, name: str | None = None) -> JobSlice:
        """Subjobs by status (a name or a list) and name glob; reads counters, not objects."""
        m = self._master
        if len(self) == 0:
            return JobSlice([])
        wanted = _status_set(status)
        indexes = m.engine.sm.subjob_ids(m.id, wanted) if wanted is not None else list(range(len(self)))  # type: ignore[arg-type]
        missing = [i for i in indexes if i not in self._built]
        if missing:
            m.engine.materialize(m, missing)
        jobs = [self._built[i] for i in indexes]
        return JobSlice([j for j in jobs if _matches(j, None, name)])

    async def kill(self, keep_going: bool = False) -> None:
        await JobSlice(list(self)).kill(keep_going=keep_going)

    async def resubmit(self, keep_going: bool = False, backend: str | Backend | None = None) -> None:
        await JobSlice(list(self)).resubmit(keep_going=keep_going, backend=backend)

