"""What the CLI prints, built from the control interface's plain dicts (the same from a service or embedded)."""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.text import Text

from ..core.statuses import ALL_STATUSES, FINAL, JobStatus

STYLES = {JobStatus.NEW: "dim", JobStatus.SUBMITTING: "cyan", JobStatus.SUBMITTED: "cyan", JobStatus.RUNNING: "yellow",
          JobStatus.COMPLETING: "yellow", JobStatus.COMPLETED: "green", JobStatus.FAILED: "red",
          JobStatus.KILLED: "magenta", JobStatus.HELD: "bright_red"}


#: What never reaches a terminal raw: C0 controls (ESC among them), DEL, C1 controls, and the Unicode controls
#: that reorder text (bidirectional embeddings, overrides and isolates).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: str, keep: str = "") -> str:
    """``text`` from a job (a name, a comment, a reason, a file's content...) as it may be shown on a terminal:
    every control character is written as its escape (ESC as ``\\x1b``), so that none moves the cursor, clears
    the screen or retitles the window; the characters in ``keep`` (``"\\n\\t"`` for a file) stay."""
    if keep:
        return _CONTROLS.sub(lambda m: m.group() if m.group() in keep else _escape(m), text)
    return _CONTROLS.sub(_escape, text)


def console() -> Console:
    """Standard output; wide tables when it is not a terminal, so that a pipe gets whole lines."""
    out = Console(highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(highlight=False, width=160)
    return out


def counts_text(counts: Mapping[str, int]) -> Text:
    text = Text()
    for status in ALL_STATUSES:
        if counts.get(status.value):
            if text:
                text.append("  ")
            text.append(f"{status.value} {counts[status.value]}", style=STYLES[status])
    return text


def status_text(status: str) -> Text:
    return Text(status, style=STYLES[JobStatus(status)])


def when(ts: float | None, now: float | None = None) -> str:
    """A time as people read it: ``14:03:07`` today, ``2026-11-24 14:03`` before."""
    if ts is None:
        return "-"
    at = dt.datetime.fromtimestamp(ts)
    today = dt.datetime.fromtimestamp(now) if now is not None else dt.datetime.now()
    return at.strftime("%H:%M:%S") if at.date() == today.date() else at.strftime("%Y-%m-%d %H:%M")


def duration(seconds: float | None) -> str:
    """``4.2s``, ``3m07s``, ``2h05m``, ``3d04h``."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, sec = divmod(int(seconds), 60)
    if m < 60:
        return f"{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h < 24 else f"{h // 24}d{h % 24:02d}h"


def short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def progress(summary: Mapping[str, Any]) -> tuple[int, int]:
    """(final, total) subjobs of a master; a runnable job counts as one."""
    counts: Mapping[str, int] = summary["counts"] or {summary["status"]: 1}
    return sum(counts.get(s.value, 0) for s in FINAL), sum(counts.values())


def totals_of(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Subjobs (a job without subjobs counts as one run) per status over the listed jobs."""
    counts: dict[str, int] = {}
    for j in summaries:
        for status, n in (j["counts"] or {j["status"]: 1}).items():
            counts[status] = counts.get(status, 0) + n
    return {"jobs": len(summaries), "subjobs": sum(counts.values()), "counts": counts}
