"""What the CLI shows of jobs, as plain records built from the API's objects.

The same records whether the orchestrator is embedded or reached through a
service (they are read through the one API), so the CLI prints the same
either way, and ``--json`` prints these records as they are.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ..core.model import JobInfo
from ..core.statuses import ALL_STATUSES, FINAL, JobStatus
from ..plugin.wrapper import read_log
from . import wire
from .job import Job

#: Subjobs listed by ``show`` on a master unless asked otherwise.
SHOW_SUBJOBS = 50


def counts(job: Job) -> dict[str, int]:
    """Per-status subjob counts of a master (from the state machine's counters), ``{}`` for a runnable job."""
    if job.parent is not None or job.id is None:
        return {}
    found = job.registry.transport.statuses().counts(job.id)
    return {s.value: found[s] for s in ALL_STATUSES if found.get(s)}


def times(job: Job, now: float | None = None, info: JobInfo | None = None) -> tuple[float | None, float | None]:
    """``(submitted at, elapsed seconds)``: from the first submission to the end, or to now while active."""
    stamps = (info or job.info).timestamps
    started = min((stamps[k] for k in ("submitting", "submitted") if k in stamps), default=None)
    if started is None:
        return None, None
    end = stamps.get("final") if not job.is_active() else None
    end = end if end is not None else (now if now is not None else time.time())
    return started, max(0.0, end - started)


def run_times(job: Job, info: JobInfo | None = None) -> tuple[float | None, float | None, float | None]:
    """``(started, ended, run seconds)``: when it started running and when it ended, by its log when the log has
    them (a master: its earliest subjob's start and, once final, its latest subjob's end); ``None`` where unknown
    (not yet started, or not yet final)."""
    stamps = (info or job.info).timestamps
    started = stamps.get("running")
    ended = stamps.get("final") if job.status in FINAL else None
    seconds = max(0.0, ended - started) if started is not None and ended is not None else None
    return started, ended, seconds


def summary(job: Job, info: JobInfo | None = None) -> dict[str, Any]:
    """The record ``orchestrator jobs`` lists for a job (``info``: its info, when already read)."""
    c = counts(job)
    info = info or job.info
    submitted_at, elapsed = times(job, info=info)
    started, ended, run_seconds = run_times(job, info)
    return {"fqid": job.fqid, "name": job.name, "owner": job.owner, "status": job.status.value,
            "backend": job.backend.name, "subjobs": sum(c.values()), "counts": c, "reason": info.reason,
            "active": job.is_active(), "submitted_at": submitted_at, "elapsed": elapsed,
            "started_at": started, "ended_at": ended, "run_seconds": run_seconds}


def summaries(jobs: Sequence[Job]) -> list[dict[str, Any]]:
    """``summary`` of each job, their infos read in one call (through a service: one request, not one each)."""
    known = [j for j in jobs if j.registry is not None]
    request = wire.InfosRequest(fqids=wire.Fqids([j.fqid_tuple for j in known]))
    infos = known[0].registry.transport.read(request) if known else []
    by_job = {id(j): JobInfo.from_dict(i) for j, i in zip(known, infos, strict=True)}
    return [summary(j, by_job.get(id(j))) for j in jobs]


def subjob_row(sub: Job) -> dict[str, Any]:
    info = sub.info
    started, ended, run_seconds = run_times(sub, info)
    host, exit_code = run_place(sub, info)
    return {"fqid": sub.fqid, "status": sub.status.value, "args": list(sub.application.args) if sub.application else [],
            "submits": info.submit_counter, "backend_id": sub.backend_id, "reason": info.reason,
            "started_at": started, "ended_at": ended, "run_seconds": run_seconds, "host": host, "exit_code": exit_code}


def run_place(job: Job, info: JobInfo | None = None) -> tuple[str | None, int | None]:
    """``(host, exit code)`` of a run's latest attempt, as its wrapper's log says (``None`` where it says nothing:
    not started, a backend that runs no wrapper, a master)."""
    info = info or job.info
    if job.id is None or info.submit_counter == 0 or counts(job):
        return None, None
    log = read_log(job.outputdir, info.submit_counter, fqid=job.fqid)
    return log.host, log.exit_code if log.exit_code is not None else log.end_code


def subjob_rows(job: Job, statuses: Sequence[str] = (), offset: int = 0, limit: int | None = None,
                ) -> list[dict[str, Any]]:
    """Rows of the master's subjobs in the given statuses (all if none), in index order, a page at a time."""
    if not counts(job):
        return []
    chosen: Iterable[Job] = job.subjobs.select(status=list(statuses)) if statuses else job.subjobs
    stop = None if limit is None else offset + limit
    return [subjob_row(sub) for sub in itertools.islice(chosen, offset, stop)]


def detail(job: Job, subjobs: int = SHOW_SUBJOBS) -> dict[str, Any]:
    app = job.application
    out: dict[str, Any] = {
        **summary(job),
        "master": job.parent.fqid if job.parent is not None else None,
        "backend_settings": dict(job.backend.settings),
        "application": app.to_dict() if app is not None else None,
        "inputfiles": list(job.inputfiles), "outputfiles": list(job.outputfiles), "mode": job.mode,
        "splitter": repr(job.splitter) if job.splitter is not None else None,
        "merger": repr(job.merger) if job.merger is not None else None,
        "comment": job.comment, "metadata": job.metadata,
        "backend_id": job.backend_id, "info": job.info.to_dict(), "outputdir": str(job.outputdir),
        "subjob_rows": [],
    }
    out["host"], out["exit_code"] = run_place(job)
    if out["counts"] and subjobs > 0:
        out["subjob_rows"] = [subjob_row(sub) for sub in job.subjobs.build(range(min(len(job.subjobs), subjobs)))]
    return out


def final_or_total(record: dict[str, Any]) -> tuple[int, int]:
    from ..core.statuses import FINAL

    c: dict[str, int] = record["counts"] or {record["status"]: 1}
    return sum(c.get(s.value, 0) for s in FINAL), sum(c.values())


__all__ = ["SHOW_SUBJOBS", "JobStatus", "counts", "detail", "run_times", "subjob_row", "subjob_rows", "summaries",
           "summary", "times"]
