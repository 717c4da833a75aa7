"""What the CLI prints, built from the control interface's plain dicts (the same from a service or embedded)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..core.statuses import ALL_STATUSES, FINAL, JobStatus

S = JobStatus
STYLES = {S.NEW: "dim", S.SUBMITTING: "cyan", S.SUBMITTED: "cyan", S.RUNNING: "yellow", S.COMPLETING: "yellow",
          S.COMPLETED: "green", S.FAILED: "red", S.KILLED: "magenta", S.HELD: "bright_red"}


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


def show(detail: dict[str, Any], out: Console, listed: bool = False, fields: Sequence[str] | None = None) -> None:
    """The job's fields, then its subjobs: the first ones, or (``listed``) exactly those chosen; ``fields``: the
    subjobs' columns (:mod:`.columns`, ``show --format``)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()

    def row(key: str, value: Any) -> None:  # every value is escaped (lists are escaped item by item first)
        grid.add_row(key, value if isinstance(value, Text) else Text(safe(str(value), keep="\n")))

    row("job", Text(detail["fqid"], style="bold"))
    if detail["master"] is not None:
        row("master", detail["master"])
    row("name", detail["name"])
    row("owner", detail.get("owner") or "-")
    row("status", status_text(detail["status"]))
    settings = ", ".join(f"{k}={short(v, 60)}" for k, v in detail["backend_settings"].items())
    row("backend", safe(detail["backend"] + (f" ({settings})" if settings else "")))
    app = detail["application"]
    if app is not None:
        row("application", safe(shlex.join([app["exe"], *app.get("args", [])])))
        if app.get("env"):
            row("env", safe(" ".join(f"{k}={v}" for k, v in app["env"].items())))
    row("inputfiles", "\n".join(map(safe, detail["inputfiles"])) or "-")
    row("outputfiles", "\n".join(map(safe, detail["outputfiles"])) or "-")
    row("mode", detail["mode"])
    if detail.get("comment"):
        row("comment", detail["comment"])  # its own lines kept, every other control escaped
    if detail.get("metadata"):
        row("metadata", safe(json.dumps(detail["metadata"], sort_keys=True, ensure_ascii=False)))
    for key in ("splitter", "merger"):
        if detail[key] is not None:
            row(key, short(detail[key]))
    row("backend_id", detail["backend_id"] or "-")
    info = detail["info"]
    row("submit_counter", info.get("submit_counter", 0))
    stamps = sorted(info.get("timestamps", {}).items(), key=lambda kv: kv[1])
    row("timestamps", "\n".join(f"{k:<11}{when(t)}" for k, t in stamps) or "-")
    if detail.get("submitted_at") is not None:
        row("elapsed", duration(detail.get("elapsed")))
    if detail.get("started_at") is not None:  # when it ran, by its log (sacct's Start, End, Elapsed)
        end = when(detail.get("ended_at")) if detail.get("ended_at") is not None else "-"
        row("ran", f"{when(detail['started_at'])} to {end}" + (f" ({duration(detail['run_seconds'])})"
                                                                  if detail.get("run_seconds") is not None else ""))
    if detail.get("host") is not None or detail.get("exit_code") is not None:
        row("host", f"{detail.get('host') or '-'}, exit code "
                    f"{'-' if detail.get('exit_code') is None else detail['exit_code']}")
    if info.get("reason"):
        row("reason", Text(safe(info["reason"]), style="red"))
    for i, entry in enumerate(info.get("history", [])):
        row("history" if i == 0 else "", safe(", ".join(f"{k}={_entry_value(k, v)}" for k, v in entry.items())))
    if info.get("retry_args"):
        row("retry_args", safe(" ".join(info["retry_args"])))
    row("outputdir", detail["outputdir"])
    cpu = detail.get("cpu")
    if cpu is None and "cpu" in detail:
        row("cpu", f"{detail['subjobs']} subjobs: see orchestrator report {detail['fqid']}")
    elif cpu is not None and cpu["attempts"]:
        wasted = Text(f"wasted {cpu['wasted']:.2f} s", style="red" if cpu["wasted"] else "")
        causes = ", ".join(f"{cause} {seconds:.2f} s" for cause, seconds in cpu["wasted_by_cause"].items())
        row("cpu", Text(f"{cpu['cpu']:.2f} s over {cpu['attempts']} attempt{'s' if cpu['attempts'] != 1 else ''}: ")
            + Text(f"useful {cpu['useful']:.2f} s", style="green") + Text(", ") + wasted
            + Text(f" ({causes})" if causes else ""))
    if detail["counts"]:
        row("subjobs", Text(f"{detail['subjobs']}: ") + counts_text(detail["counts"]))
    out.print(grid)
    if listed:
        out.print()
        out.print(subjobs_table(detail["subjob_rows"], fields, out.width) if detail["subjob_rows"]
                  else Text("no such subjobs"), soft_wrap=True)
    elif detail["counts"]:
        _subjobs(detail, out, fields)


def _subjobs(detail: dict[str, Any], out: Console, fields: Sequence[str] | None) -> None:
    out.print()
    out.print(subjobs_table(detail["subjob_rows"], fields, out.width), soft_wrap=True)
    n = detail["subjobs"]
    rows = detail["subjob_rows"]
    if n > len(rows):
        out.print(Text(f"... and {n - len(rows)} more subjobs (orchestrator show {detail['fqid']} --all, "
                       f"or --status STATUS)", style="dim"))


def _entry_value(key: str, value: Any) -> str:
    """A failure history entry's value as shown: its ``time`` as a local clock time, never raw epoch seconds."""
    if key == "time" and isinstance(value, int | float) and not isinstance(value, bool):
        return when(value)
    return short(value, 80)


def subjobs_table(rows: list[dict[str, Any]], fields: Sequence[str] | None = None, width: int | None = None) -> Text:
    """A master's subjobs in sacct's columns (:data:`.columns.SUBJOBS`, or ``fields``)."""
    from .columns import SUBJOBS, table  # (columns uses this module's styles and formats)

    return table(rows, list(fields or SUBJOBS), width)
