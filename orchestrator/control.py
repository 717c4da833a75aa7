"""The control interface: every user operation on a home, in and out as plain JSON-able values.

One class, two transports. The service's HTTP API calls a :class:`Control`
on its own open orchestrator (``/api/<method>`` with the keyword arguments as
a JSON body); the CLI calls a :class:`Control` directly when no service runs
on the home, or a :class:`~orchestrator.service.client.ServiceClient` with
the same methods when one does. So the CLI renders the same dicts either
way, and an operation has one implementation.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.lowlevel

from .errors import JobError
from .ids import fqid_str, parse_fqid
from .job import Job
from .orchestrator import Orchestrator
from .status import ALL_STATUSES, JobStatus

S = JobStatus
#: Status codes (0-9) as the digits of a string: a master's subjob statuses in one JSON value.
_DIGITS = bytes.maketrans(bytes(range(10)), b"0123456789")
#: Subjobs listed by ``show`` on a master unless asked otherwise.
SHOW_SUBJOBS = 50


class UnknownJobError(JobError, KeyError):
    """No job has this id (a ``KeyError`` too, as ``orch.jobs[...]`` raises)."""

    def __str__(self) -> str:
        return str(self.args[0])


def counts_of(orch: Orchestrator, job: Job) -> dict[str, int]:
    """Per-status subjob counts of a master (from the state machine's counters), ``{}`` for a runnable job."""
    fq = job.fqid_tuple
    sm = orch.engine.sm
    if len(fq) == 1 and sm.is_master(fq[0]):
        return {s.value: n for s, n in sm.master(fq[0]).count_map().items() if n}
    return {}


def summary(orch: Orchestrator, job: Job) -> dict[str, Any]:
    counts = counts_of(orch, job)
    return {"fqid": job.fqid, "name": job.name, "status": job.status.value, "backend": job.backend.name,
            "subjobs": sum(counts.values()), "counts": counts, "reason": job.info.reason,
            "active": orch.engine.is_active(job, include_postprocess=True)}


class Control:
    """User operations on an open :class:`Orchestrator`. ``refresh``: ask the backends before a listing
    (an embedded CLI call has no monitoring loop running between calls; the service has)."""

    def __init__(self, orch: Orchestrator, *, refresh: bool = True) -> None:
        self.orch = orch
        self._refresh = refresh

    def job(self, fqid: str) -> Job:
        try:
            return self.orch.jobs(fqid_str(parse_fqid(fqid)))
        except (KeyError, ValueError):
            raise UnknownJobError(f"no job {fqid}") from None

    async def refresh(self) -> None:
        """Ask each backend once for news, and let the mergers that starts finish."""
        if not self._refresh:
            return
        await self.orch.engine.poll_once()
        for _ in range(5):  # the engine applies the reports in its own task
            await anyio.lowlevel.checkpoint()
        await self.settle()

    async def settle(self) -> None:
        """Let mergers due on jobs that just ended run before an embedded home is closed."""
        if not self._refresh:
            return
        for job in self.orch.jobs:
            if not job.is_active():
                with anyio.move_on_after(30):
                    await job.wait()

    # ------------------------------------------------------------- reading
    async def health(self) -> dict[str, Any]:
        e = self.orch.engine
        return {"ok": True, "pid": os.getpid(), "home": str(self.orch.home), "jobs": len(e.jobs),
                "monitored": sum(len(r) for r in e.active.values()), "time": time.time()}

    async def jobs(self, status: Sequence[str] | None = None, name: str | None = None) -> list[dict[str, Any]]:
        await self.refresh()
        return [summary(self.orch, j) for j in self.orch.jobs.select(status=list(status or ()) or None, name=name)]

    async def select(self, status: Sequence[str] | None = None, name: str | None = None,
                     within: str | None = None) -> list[str]:
        """fqids of top-level jobs, or of the subjobs of ``within``, by status and name glob."""
        wanted = list(status or ()) or None
        if within is None:
            return [j.fqid for j in self.orch.jobs.select(status=wanted, name=name)]
        return [j.fqid for j in self.job(within).subjobs.select(status=wanted, name=name)]

    async def state(self, fqid: str) -> dict[str, Any]:
        """Status, counts and every subjob's status code in one string (for remote job objects)."""
        job = self.job(fqid)
        fq = job.fqid_tuple
        sm = self.orch.engine.sm
        codes = ""
        if len(fq) == 1 and sm.is_master(fq[0]):
            codes = bytes(sm.master(fq[0]).statuses).translate(_DIGITS).decode()
        return {**summary(self.orch, job), "codes": codes, "backend_id": job.backend_id,
                "info": job.info.to_dict()}

    async def show(self, fqid: str, subjobs: int = SHOW_SUBJOBS) -> dict[str, Any]:
        await self.refresh()
        job = self.job(fqid)
        app = job.application
        out: dict[str, Any] = {
            **summary(self.orch, job),
            "master": job.parent.fqid if job.parent is not None else None,
            "backend_settings": dict(job.backend.settings),
            "application": app.to_dict() if app is not None else None,
            "inputfiles": list(job.inputfiles), "outputfiles": list(job.outputfiles), "mode": job.mode,
            "splitter": repr(job.splitter) if job.splitter is not None else None,
            "merger": repr(job.merger) if job.merger is not None else None,
            "backend_id": job.backend_id, "info": job.info.to_dict(), "outputdir": str(job.outputdir),
            "subjob_rows": [],
        }
        fq = job.fqid_tuple
        if len(fq) == 1 and self.orch.engine.sm.is_master(fq[0]):
            first = list(range(min(len(job.subjobs), max(subjobs, 0))))
            for sub in self.orch.engine.materialize(job, first):  # one query for the page
                out["subjob_rows"].append({
                    "fqid": sub.fqid, "status": sub.status.value,
                    "args": list(sub.application.args) if sub.application else [],
                    "submits": sub.info.submit_counter, "backend_id": sub.backend_id, "reason": sub.info.reason})
        return out

    # ------------------------------------------------------------ changing
    async def add(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        """Register a job from its definition (``Job.spec()``)."""
        try:
            job = Job.from_spec(name, spec)
        except (KeyError, TypeError, ValueError) as exc:
            raise JobError(f"unreadable job definition: {type(exc).__name__}: {exc}", fqid="(new)") from None
        added = await self.orch.jobs.add(job)
        return summary(self.orch, added)

    async def submit(self, fqid: str, keep_going: bool = False) -> dict[str, Any]:
        job = self.job(fqid)
        await job.submit(keep_going=keep_going)
        return summary(self.orch, job)

    async def kill(self, fqid: str, keep_going: bool = False) -> dict[str, Any]:
        job = self.job(fqid)
        await job.kill(keep_going=keep_going)
        await self.settle()
        return summary(self.orch, job)

    async def resubmit(self, fqid: str, only_failed: bool = True, keep_going: bool = False,
                       from_state: str | None = None, backend: dict[str, Any] | str | None = None) -> dict[str, Any]:
        from .model import Backend

        job = self.job(fqid)
        chosen = Backend.from_dict(backend) if isinstance(backend, dict) else backend
        await job.resubmit(only_failed=only_failed, keep_going=keep_going, from_state=from_state, backend=chosen)
        return summary(self.orch, job)

    async def release(self, fqid: str, retry_args: Sequence[str] | None = None) -> dict[str, Any]:
        job = self.job(fqid)
        await job.release(retry_args=list(retry_args) if retry_args is not None else None)
        return summary(self.orch, job)

    async def copy(self, fqid: str) -> dict[str, Any]:
        return summary(self.orch, await self.job(fqid).copy())

    async def remove(self, fqid: str) -> dict[str, Any]:
        job = self.job(fqid)
        await job.remove()
        return {"fqid": fqid_str(parse_fqid(fqid)), "removed": True}

    async def wait(self, fqid: str, timeout: float | None = None) -> dict[str, Any]:
        """Return once nothing of the job is active, or after ``timeout`` (``timed_out`` says which)."""
        job = self.job(fqid)
        try:
            await job.wait(timeout=timeout)
            timed_out = False
        except TimeoutError:
            timed_out = True
        else:
            await self.orch.engine.flush()  # what a client is told has ended is on disk
        return {**summary(self.orch, job), "timed_out": timed_out}

    # ------------------------------------------- remote job objects (orchestrator.service.remote)
    async def describe(self, fqids: Sequence[str] | None = None) -> dict[str, Any]:
        """Every field a remote job object shows, for many jobs in one answer (``None``: each top-level job).

        Read without an ``await``, so ``time`` places the whole answer among the
        status events: an event stamped at or after it is newer. A master's record
        carries ``codes`` (its subjobs' statuses), so its status and its subjobs'
        statuses always come from the same instant; subjobs of one master are read
        in one repository query.
        """
        jobs = list(self.orch.jobs) if fqids is None else self._jobs_bulk(fqids)
        sm = self.orch.engine.sm
        records = []
        for job in jobs:
            fq, app = job.fqid_tuple, job.application
            record: dict[str, Any] = {
                "fqid": job.fqid, "name": job.name, "status": job.status.value,
                "application": app.to_dict() if app is not None else None, "backend": job.backend.to_dict(),
                "inputfiles": list(job.inputfiles), "outputfiles": list(job.outputfiles), "mode": job.mode,
                "backend_id": job.backend_id, "info": job.info.to_dict(), "workspace": str(job.workspace),
                "inputdir": str(job.inputdir), "outputdir": str(job.outputdir)}
            if len(fq) == 1 and sm.is_master(fq[0]):
                record["codes"] = bytes(sm.master(fq[0]).statuses).translate(_DIGITS).decode()
            records.append(record)
        return {"time": time.time(), "jobs": records}

    async def kill_many(self, fqids: Sequence[str], keep_going: bool = False) -> dict[str, Any]:
        """Kill a slice (jobs or subjobs) as one collective operation, as ``JobSlice.kill`` does."""
        from .job import JobSlice

        jobs = self._jobs_bulk(fqids)
        await JobSlice(jobs).kill(keep_going=keep_going)
        await self.settle()
        return {"fqids": [j.fqid for j in jobs]}

    async def resubmit_many(self, fqids: Sequence[str], keep_going: bool = False,
                            backend: dict[str, Any] | str | None = None) -> dict[str, Any]:
        """Resubmit a slice as one collective operation, as ``JobSlice.resubmit`` does."""
        from .job import JobSlice
        from .model import Backend

        jobs = self._jobs_bulk(fqids)
        chosen = Backend.from_dict(backend) if isinstance(backend, dict) else backend
        await JobSlice(jobs).resubmit(keep_going=keep_going, backend=chosen)
        return {"fqids": [j.fqid for j in jobs]}

    def _jobs_bulk(self, fqids: Sequence[str]) -> list[Job]:
        """Jobs by fqid, the subjobs of each master built in one repository query (not one per subjob)."""
        found: dict[int, Job] = {}
        wanted: dict[int, list[tuple[int, int]]] = {}  # master id -> (position, subjob index)
        for pos, text in enumerate(fqids):
            try:
                fq = parse_fqid(str(text))
            except ValueError:
                raise UnknownJobError(f"no job {text}") from None
            if len(fq) == 2:
                wanted.setdefault(fq[0], []).append((pos, fq[1]))
            else:
                found[pos] = self.job(fqid_str(fq))
        for master_id, items in wanted.items():
            master = self.job(str(master_id))
            n = len(master.subjobs)
            missing = [i for _, i in items if not 0 <= i < n]
            if missing:
                raise UnknownJobError(f"no job {master_id}.{missing[0]}")
            subs = self.orch.engine.materialize(master, [i for _, i in items])
            found.update((pos, sub) for (pos, _), sub in zip(items, subs, strict=True))
        return [found[pos] for pos in range(len(fqids))]


#: The methods a client may call (the HTTP API's routes): everything public above but ``job``.
METHODS = frozenset({"health", "jobs", "select", "state", "show", "add", "submit", "kill", "resubmit", "release",
                     "copy", "remove", "wait",
                     "describe", "kill_many", "resubmit_many"})
#: Status values in display order.
STATUS_ORDER = [s.value for s in ALL_STATUSES]
