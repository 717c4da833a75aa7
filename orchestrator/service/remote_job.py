"""Jobs, subjob lists and slices of a :class:`~orchestrator.service.remote.RemoteOrchestrator`.

They mirror :class:`~orchestrator.job.Job`, ``SubjobList`` and ``JobSlice``:
the same attributes and operations, and the same object for the same job
(the orchestrator keeps one proxy per job). What a proxy holds is described
in :mod:`orchestrator.service.remote`; its definition (application, backend,
files) is a read-only view, since the job itself lives in the service.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from ..errors import JobError
from ..ids import FQID, fqid_str
from ..job import _status_set
from ..model import Backend, Executable, JobInfo
from ..status import ACTIVE, JobStatus

if TYPE_CHECKING:
    from .remote import RemoteOrchestrator

_ACTIVE_CODES = tuple(s.code for s in ACTIVE)
#: Subjob details are read a page of this many subjobs at a time.
PAGE = 1000
#: Seconds of one ``wait`` request; a longer wait asks again.
WAIT_SLICE = 30.0


class Record:
    """One read of a job's details (``Control.describe``), stamped with the service's time of the read."""

    __slots__ = ("application", "backend", "backend_id", "info", "inputdir", "inputfiles", "mode", "name",
                 "outputdir", "outputfiles", "stale", "time", "workspace")

    def __init__(self, data: dict[str, Any], time: float) -> None:
        self.time = time
        #: Set by a status change or an operation: ``info``, ``backend_id`` and ``backend`` must be read again.
        self.stale = False
        self.name = str(data.get("name") or "")
        app = data.get("application")
        self.application = Executable.from_dict(app) if app else None
        self.backend = Backend.from_dict(data["backend"])
        self.inputfiles = [str(f) for f in data.get("inputfiles", [])]
        self.outputfiles = [str(f) for f in data.get("outputfiles", [])]
        self.mode = str(data.get("mode", "production"))
        backend_id = data.get("backend_id")
        self.backend_id = str(backend_id) if backend_id is not None else None
        self.info = JobInfo.from_dict(data.get("info"))
        self.workspace = Path(data["workspace"])
        self.inputdir = Path(data["inputdir"])
        self.outputdir = Path(data["outputdir"])


class RemoteJob:
    """A job or subjob held by the service; see :class:`~orchestrator.job.Job` for what each member means."""

    def __init__(self, orch: RemoteOrchestrator, fqid: FQID, parent: RemoteJob | None) -> None:
        self._orch = orch
        self.id: int = fqid[-1]
        self.parent: RemoteJob | None = parent
        self._fq = fqid
        # A top-level job's own state; a subjob reads its status from its master's codes.
        self._status = JobStatus.NEW
        self._codes = bytearray()
        #: The service's time of the last read of this (top-level) job: older events are already in it.
        self._snap = -math.inf
        self._rec: Record | None = None
        self._subrecs: dict[int, Record] = {}
        self._built: dict[int, RemoteJob] = {}
        self._removed = False
        self._subjobs = RemoteSubjobList(self)

    # ------------------------------------------------------------ identity
    @property
    def fqid_tuple(self) -> FQID:
        return self._fq

    @property
    def fqid(self) -> str:
        return fqid_str(self._fq)

    @property
    def master(self) -> RemoteJob | None:
        """Ganga's name for ``parent``."""
        return self.parent

    # ------------------------------------------------------------ state
    @property
    def status(self) -> JobStatus:
        if self.parent is None:
            return self._status
        codes = self.parent._codes
        return JobStatus.from_code(codes[self.id]) if self.id < len(codes) else JobStatus.NEW

    @property
    def subjobs(self) -> RemoteSubjobList:
        return self._subjobs

    def is_active(self) -> bool:
        """Something of this job is submitting, submitted, running or completing."""
        if self.status in ACTIVE:
            return True
        return self.parent is None and any(c in self._codes for c in _ACTIVE_CODES)

    # ------------------------------------------------------------ details (read lazily, in bulk)
    @property
    def name(self) -> str:
        return self._orch._details(self, fresh=False).name

    @property
    def application(self) -> Executable | None:
        return self._orch._details(self, fresh=False).application

    @property
    def inputfiles(self) -> list[str]:
        return self._orch._details(self, fresh=False).inputfiles

    @property
    def outputfiles(self) -> list[str]:
        return self._orch._details(self, fresh=False).outputfiles

    @property
    def mode(self) -> str:
        return self._orch._details(self, fresh=False).mode

    @property
    def backend(self) -> Backend:
        return self._orch._details(self, fresh=True).backend

    @property
    def backend_id(self) -> str | None:
        return self._orch._details(self, fresh=True).backend_id

    @property
    def info(self) -> JobInfo:
        return self._orch._details(self, fresh=True).info

    @property
    def workspace(self) -> Path:
        return self._orch._details(self, fresh=False).workspace

    @property
    def inputdir(self) -> Path:
        return self._orch._details(self, fresh=False).inputdir

    @property
    def outputdir(self) -> Path:
        return self._orch._details(self, fresh=False).outputdir

    # --------------------------------------------------------- operations
    async def submit(self, keep_going: bool = False) -> None:
        await self._orch._operate([self], "submit", fqid=self.fqid, keep_going=keep_going)

    async def kill(self, keep_going: bool = False) -> None:
        await self._orch._operate([self], "kill", fqid=self.fqid, keep_going=keep_going)

    async def resubmit(self, only_failed: bool = True, backend: str | Backend | None = None,
                       keep_going: bool = False, from_state: str | None = None) -> None:
        """Run again. ``from_state``: the text of a saved state (``orchestrator checkpoint get``) to start from."""
        await self._orch._operate([self], "resubmit", fqid=self.fqid, only_failed=only_failed,
                                  keep_going=keep_going, from_state=from_state, backend=_backend_arg(backend))

    async def release(self, retry_args: Sequence[str] | None = None) -> None:
        """Resume a held job; ``retry_args`` reach it as ``ORCH_RETRY_ARG_1..n``."""
        await self._orch._operate([self], "release", fqid=self.fqid,
                                  retry_args=list(retry_args) if retry_args is not None else None)

    async def copy(self) -> RemoteJob:
        copied = await self._orch._operate([self], "copy", fqid=self.fqid)
        await self._orch._load([copied["fqid"]])
        return self._orch._top(int(copied["fqid"]))

    async def remove(self) -> None:
        await self._orch._operate([self], "remove", reread=False, fqid=self.fqid)
        self._orch._forget(self)

    async def wait(self, timeout: float | None = None) -> None:
        """Return once nothing of the job is active; ``TimeoutError`` after ``timeout`` seconds, as embedded.

        Asked in slices of ``WAIT_SLICE`` seconds: a wait given up here (cancelled)
        leaves the service waiting for at most one slice.
        """
        deadline = math.inf if timeout is None else anyio.current_time() + timeout
        while True:
            left = max(0.0, min(WAIT_SLICE, deadline - anyio.current_time()))
            result = await self._orch._operate([self], "wait", reread=False, fqid=self.fqid, timeout=left)
            if not result.get("timed_out") or anyio.current_time() >= deadline:
                break
        await self._orch._after([self._top_job()])
        if result.get("timed_out"):
            raise TimeoutError(f"job {self.fqid} is still active after {timeout:g} s")

    async def refresh(self) -> None:
        """Read this job's status and details now, with its master's or subjobs' (one request, no blocking)."""
        self._check()
        top = self._top_job()
        n = len(top._codes)
        indexes = range(n) if n <= PAGE else sorted(i for i in top._built if i < n)
        await self._orch._load([top.fqid, *(f"{top.id}.{i}" for i in indexes)])

    # ------------------------------------------------------------ internals
    def _top_job(self) -> RemoteJob:
        return self if self.parent is None else self.parent._top_job()

    def _record(self) -> Record | None:
        return self._rec if self.parent is None else self.parent._subrecs.get(self.id)

    def _check(self) -> None:
        if self._top_job()._removed:
            raise JobError("has been removed", fqid=self.fqid)

    def _set_codes(self, codes: bytearray) -> None:
        """New subjob statuses; subjobs past the end (a submission rolled back) are dropped."""
        self._codes = codes
        n = len(codes)
        for i in [i for i in self._built if i >= n]:
            del self._built[i]
        for i in [i for i in self._subrecs if i >= n]:
            del self._subrecs[i]

    def _subjob(self, index: int) -> RemoteJob:
        job = self._built.get(index)
        if job is None:
            job = self._built[index] = RemoteJob(self._orch, (*self._fq, index), self)
        return job

    def __repr__(self) -> str:
        rec = self._record()
        name = f" {rec.name!r}" if rec is not None else ""
        return f"<Job {self.fqid}{name} {self.status.value} (service)>"


def _backend_arg(backend: str | Backend | None) -> dict[str, Any] | str | None:
    return backend.to_dict() if isinstance(backend, Backend) else backend


class RemoteSlice:
    """A list of jobs with collective operations (``kill``, ``resubmit``), each one request to the service."""

    def __init__(self, jobs: Sequence[RemoteJob]) -> None:
        self._jobs = list(jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[RemoteJob]:
        return iter(self._jobs)

    def __getitem__(self, i: int) -> RemoteJob:
        return self._jobs[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (RemoteSlice, RemoteSubjobList, list, tuple)):
            return len(self) == len(other) and all(a is b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __repr__(self) -> str:
        return f"RemoteSlice({self._jobs!r})"

    def select(self, status: Any = None, name: str | None = None) -> RemoteSlice:
        wanted = _status_set(status)
        return RemoteSlice([j for j in self._jobs if (wanted is None or j.status in wanted)
                            and (name is None or fnmatch.fnmatchcase(j.name, name))])

    async def kill(self, keep_going: bool = False) -> None:
        if self._jobs:
            await self._jobs[0]._orch._operate(self._jobs, "kill_many", fqids=[j.fqid for j in self._jobs],
                                               keep_going=keep_going)

    async def resubmit(self, keep_going: bool = False, backend: str | Backend | None = None) -> None:
        if self._jobs:
            await self._jobs[0]._orch._operate(self._jobs, "resubmit_many", fqids=[j.fqid for j in self._jobs],
                                               keep_going=keep_going, backend=_backend_arg(backend))


class RemoteSubjobList:
    """A master's subjobs: ``j.subjobs[i]``, ``j.subjobs(i)``, ``select()``, ``len()``, from the cached codes."""

    def __init__(self, master: RemoteJob) -> None:
        self._master = master

    def __len__(self) -> int:
        return len(self._master._codes) if self._master.parent is None else 0

    def _get(self, index: int) -> RemoteJob:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"job {self._master.fqid} has no subjob {index} (it has {n})")
        return self._master._subjob(index)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return RemoteSlice([self._master._subjob(i) for i in range(len(self))[index]])
        return self._get(index)

    def __call__(self, index: int) -> RemoteJob:
        return self._get(index)

    def __iter__(self) -> Iterator[RemoteJob]:
        return (self._master._subjob(i) for i in range(len(self)))

    def __bool__(self) -> bool:
        return len(self) > 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (RemoteSlice, RemoteSubjobList, list, tuple)):
            return len(self) == len(other) and all(a is b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __repr__(self) -> str:
        return f"<{len(self)} subjobs of job {self._master.fqid}>"

    def select(self, status: Any = None, name: str | None = None) -> RemoteSlice:
        """Subjobs by status (a name or a list) and name glob; statuses from the cached codes, names in one read."""
        m = self._master
        if len(self) == 0:
            return RemoteSlice([])
        wanted = _status_set(status)
        if wanted is None:
            indexes = list(range(len(self)))
        else:
            codes = {s.code for s in wanted}
            indexes = [i for i, c in enumerate(m._codes) if c in codes]
        if name is not None:
            m._orch._names(m, indexes)
            indexes = [i for i in indexes if fnmatch.fnmatchcase(m._subrecs[i].name, name)]
        return RemoteSlice([m._subjob(i) for i in indexes])

    async def kill(self, keep_going: bool = False) -> None:
        await RemoteSlice(list(self)).kill(keep_going=keep_going)

    async def resubmit(self, keep_going: bool = False, backend: str | Backend | None = None) -> None:
        await RemoteSlice(list(self)).resubmit(keep_going=keep_going, backend=backend)
