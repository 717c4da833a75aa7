"""A job as the repository stores it, built in the core: the runtime writes these and never holds a job's state.

:func:`stored_job` is a top-level job's own row (its status, its ``info`` in
the v3 form, its size), :func:`run_arrays` its run arrays as bytes and
:func:`run_infos` the extras of a master's subjobs that hold anything.
The state machine answers with them (``sm.stored_job(job)`` and the rest),
so the writer and the preparer store a job without reading the core's
tables themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass
from typing import Any

from .jobs import JobState


@dataclass(slots=True)
class StoredJob:
    """A top-level job's own row: what ``jobs.status``, ``jobs.info``, ``n_subjobs`` and ``added`` hold."""

    status: str
    info: dict[str, Any]
    n_subjobs: int
    created: float


@dataclass(frozen=True, slots=True)
class RunArrays:
    """A job's run arrays as stored: one status byte, one attempt (``I``) and one time (``d``) per kind and run."""

    status: bytes
    attempt: bytes
    times: dict[str, bytes]


def stored_info(js: JobState) -> dict[str, Any]:
    """A top-level job's own state, as ``jobs.info`` stores it (v3)."""
    out: dict[str, Any] = {"top": js.top.to_dict(), "attempt": js.attempt}
    if not js.is_master:
        extra = js.runs.extras.get(0)
        out["run"] = extra.to_dict() if extra is not None else {}
    if js.partition:
        out["partition"] = js.partition
    if js.link is not None:
        out["link"] = list(js.link)
    if js.post_failed:
        out["post_failed"] = True
    if js.merged_at:
        out["merged_at"] = js.merged_at
    return out


def stored_job(js: JobState) -> StoredJob:
    return StoredJob(js.status.value, stored_info(js), len(js.runs) if js.is_master else 0, js.created)


def run_arrays(js: JobState) -> RunArrays:
    runs = js.runs
    return RunArrays(bytes(runs.status), runs.attempt.tobytes(),
                     {kind: values.tobytes() for kind, values in runs.times.items()})


def run_infos(js: JobState, indexes: Set[int] | None) -> dict[int, dict[str, Any]]:
    """The stored extras of a master's subjobs among ``indexes`` (``None``: all) that hold anything, by index.

    Scans whichever is smaller, the extras or the indexes: of a million subjobs that moved, few have extras."""
    if not js.is_master:
        return {}
    extras = js.runs.extras
    if indexes is None:
        chosen: Iterable[int] = extras
    elif len(extras) <= len(indexes):
        chosen = [i for i in extras if i in indexes]
    else:
        chosen = [i for i in indexes if i in extras]
    out: dict[int, dict[str, Any]] = {}
    for i in chosen:
        info = extras[i].to_dict()
        if info:
            out[i] = info
    return out


__all__ = ["RunArrays", "StoredJob", "run_arrays", "run_infos", "stored_info", "stored_job"]
