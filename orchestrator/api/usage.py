"""Useful and wasted CPU of a job, read from its runs' ``orch.usage`` records (:mod:`orchestrator.core.usage`).

Read where the runs' output dirs are: embedded, or through a service on the
same machine (the CLI reads them as ``peek`` does).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..core.usage import Tally
from ..runtime.runs import read_usage
from .job import Job


def runs_of(job: Job) -> Iterable[Job]:
    """The runs of a job: its subjobs, or the job itself."""
    return job.subjobs if len(job.subjobs) else [job]


def report(job: Job) -> dict[str, Any]:
    """Useful and wasted CPU of a job (every subjob of a master), in seconds, with the wasted part by cause."""
    total = Tally()
    for run_ in runs_of(job):
        attempts = read_usage(Path(run_.outputdir), "." in run_.fqid)
        if attempts is not None:
            total.add(attempts, run_.info.history)
    return {"schema": 1, "fqid": job.fqid, "name": job.name, "status": job.status.value, "attempts": total.attempts,
            "cpu": total.useful + total.wasted, "useful": total.useful, "wasted": total.wasted, "wall": total.wall,
            "wasted_by_cause": dict(sorted(total.by_cause.items(), key=lambda kv: -kv[1]))}


__all__ = ["report", "runs_of"]
