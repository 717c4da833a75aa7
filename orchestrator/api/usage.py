"""Useful and wasted CPU of a job, read from its runs' ``orch.usage`` records (:mod:`orchestrator.core.usage`).

Read where the runs' output dirs are: embedded, or through a service on the
same machine (the CLI reads them as ``peek`` does).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..core.usage import USAGE_FILE, judge, parse_usage
from .job import Job


def runs_of(job: Job) -> Iterable[Job]:
    """The runs of a job: its subjobs, or the job itself."""
    return job.subjobs if len(job.subjobs) else [job]


def report(job: Job) -> dict[str, Any]:
    """Useful and wasted CPU of a job (every subjob of a master), in seconds, with the wasted part by cause."""
    useful = wasted = wall = 0.0
    attempts = 0
    by_cause: dict[str, float] = {}
    for run_ in runs_of(job):
        try:
            text = (Path(run_.outputdir) / USAGE_FILE).read_text(errors="replace")
        except FileNotFoundError:
            continue
        for a, cause in judge(parse_usage(text), run_.info.history):
            attempts += 1
            wall += a.wall
            if cause is None:
                useful += a.cpu
            else:
                wasted += a.cpu
                by_cause[cause] = by_cause.get(cause, 0.0) + a.cpu
    return {"schema": 1, "fqid": job.fqid, "name": job.name, "status": job.status.value, "attempts": attempts,
            "cpu": useful + wasted, "useful": useful, "wasted": wasted, "wall": wall,
            "wasted_by_cause": dict(sorted(by_cause.items(), key=lambda kv: -kv[1]))}


__all__ = ["report", "runs_of"]
