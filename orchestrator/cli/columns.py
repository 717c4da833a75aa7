"""The columns of ``orchestrator jobs`` and of a master's subjobs in ``show``, as sacct's: fixed, documented, and
chosen with ``--format FIELD,...`` (docs/reference.md, "Columns").

Every field reads one record of :mod:`orchestrator.api.views` (a job's ``summary``, a subjob's row); times are this
machine's local clock times, durations ``4.2s``, ``3m07s``, ``2h05m``; a field a record has no value for is ``-``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from ..core.statuses import JobStatus
from .render import STYLES, duration, safe, when

Record = Mapping[str, Any]

#: The count columns of ``jobs``, each the subjobs in these statuses: every status counted once.
GROUPS: dict[str, tuple[str, ...]] = {
    "pending": ("new", "submitting", "submitted"), "running": ("running", "completing"),
    "completed": ("completed",), "failed": ("failed",), "killed": ("killed",), "held": ("held",),
}


@dataclass(frozen=True)
class Field:
    header: str
    value: Callable[[Record], str]
    right: bool = False
    style: Callable[[Record], str | None] = lambda r: None


def _elapsed(r: Record) -> str:
    """A run's time: from its start to its end, or to now while it runs (the hung one stands out)."""
    if r.get("run_seconds") is not None:
        return duration(r["run_seconds"])
    if "counts" in r and r.get("elapsed") is not None:  # a job: from its first submission
        return duration(r["elapsed"])
    if r.get("started_at") is not None and r.get("status") in ("running", "completing"):
        return duration(max(0.0, time.time() - r["started_at"]))
    return "-"


def _count(group: str) -> Callable[[Record], str]:
    def value(r: Record) -> str:
        counts = r.get("counts") or {}
        if not counts:
            return ""
        n = sum(counts.get(s, 0) for s in GROUPS[group])
        return str(n) if n else ""
    return value


def _group_style(group: str) -> Callable[[Record], str | None]:
    style = STYLES[JobStatus(GROUPS[group][-1])]
    return lambda r: style


def _text(key: str, limit: int = 0) -> Callable[[Record], str]:
    def value(r: Record) -> str:
        v = r.get(key)
        if v is None or v == "":
            return "-"
        text = safe(str(v))
        return text if not limit or len(text) <= limit else text[:limit - 1] + "\u2026"
    return value


FIELDS: dict[str, Field] = {
    "jobid": Field("id", lambda r: r["fqid"]),
    "name": Field("name", _text("name")),
    "owner": Field("owner", _text("owner")),
    "state": Field("status", lambda r: r["status"], style=lambda r: STYLES[JobStatus(r["status"])]),
    "backend": Field("backend", _text("backend")),
    "subjobs": Field("subjobs", lambda r: str(r["subjobs"]) if r.get("counts") else "", right=True),
    **{g: Field(g, _count(g), right=True, style=_group_style(g)) for g in GROUPS},
    "submit": Field("submit", lambda r: when(r.get("submitted_at"))),
    "start": Field("start", lambda r: when(r.get("started_at"))),
    "end": Field("end", lambda r: when(r.get("ended_at"))),
    "elapsed": Field("elapsed", _elapsed, right=True),
    "exitcode": Field("exit", lambda r: "-" if r.get("exit_code") is None else str(r["exit_code"]), right=True),
    "attempts": Field("attempts", lambda r: str(r["submits"]) if "submits" in r else "-", right=True),
    "backendid": Field("backend_id", _text("backend_id")),
    "host": Field("host", _text("host")),
    "args": Field("args", lambda r: safe(" ".join(r.get("args") or [])) or "-"),
    "reason": Field("reason", _text("reason", 160), style=lambda r: "red"),
}
#: ``orchestrator jobs``, always these columns in this order.
JOBS = ("jobid", "name", "owner", "state", "backend", "subjobs", *GROUPS, "submit", "elapsed")
#: A master's subjobs in ``show``, always these columns in this order.
SUBJOBS = ("jobid", "state", "args", "start", "end", "elapsed", "exitcode", "attempts", "host", "backendid",
           "reason")


def parse_format(text: str | None, default: Sequence[str]) -> list[str]:
    """``--format start,end,elapsed``: the fields asked for, each known (``ValueError`` naming the others)."""
    if not text:
        return list(default)
    chosen = [f.strip().lower() for f in text.split(",") if f.strip()]
    unknown = [f for f in chosen if f not in FIELDS]
    if unknown or not chosen:
        raise ValueError(f"unknown field {unknown[0] if unknown else text!r} in --format; fields: "
                         f"{', '.join(FIELDS)}")
    return chosen


def table(records: Sequence[Record], fields: Sequence[str], width: int | None = None,
          totals: Record | None = None) -> Text:
    """Aligned columns, one line per record (and a totals line), as one ``Text``; ``width``: the console's, the
    reasons and arguments cut to fit it (never the ids, times or names: a line may be wider)."""
    chosen = [FIELDS[f] for f in fields]
    rows: list[list[tuple[str, str | None]]] = [[(f.value(r), f.style(r)) for f in chosen] for r in records]
    if totals is not None:
        rows.append([(f.value(totals), "bold") if name in GROUPS or name == "subjobs" else
                     ((f"{totals['jobs']} jobs", "bold") if name == "name" else ("", None))
                     for name, f in zip(fields, chosen, strict=True)])
    headers = [f.header for f in chosen]
    widths = [max(len(h), *(len(row[k][0]) for row in rows)) if rows else len(h) for k, h in enumerate(headers)]
    gaps = 2 * (len(widths) - 1)
    if width is not None and sum(widths) + gaps > width:
        for cut in ("reason", "args"):  # a name stays whole: it is how a user tells their jobs apart
            if cut in fields and sum(widths) + gaps > width:
                k = fields.index(cut)
                widths[k] = max(len(headers[k]), 8, widths[k] - (sum(widths) + gaps - width))
    text = Text(no_wrap=True, overflow="ignore")
    head: list[tuple[str, str | None]] = [(h, "bold") for h in headers]
    for row in [head, *rows]:
        for k, (cell, style) in enumerate(row):
            if len(cell) > widths[k]:
                cell = cell[:widths[k] - 1] + "\u2026"
            if k:
                text.append("  ")
            text.append(cell.rjust(widths[k]) if chosen[k].right else cell.ljust(widths[k]), style)
        text.append("\n")
    text.rstrip()
    return text
