"""What the CLI prints, built from the control interface's plain dicts (the same from a service or embedded)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shlex
from collections.abc import Mapping
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


#: The columns of ``orchestrator jobs``, always in this order; per-status counts come between subjobs and
#: submitted, one column per status that any listed job has.
JOBS_COLUMNS = ("id", "name", "owner", "status", "backend", "subjobs", "submitted", "elapsed")
#: Of those, the ones before the per-status counts.
_BEFORE_COUNTS = JOBS_COLUMNS.index("subjobs") + 1


def jobs_table(summaries: list[dict[str, Any]], width: int | None = None) -> Text:
    """``orchestrator jobs``: a line per job in aligned columns, totals last, as one ``Text``. (A rich ``Table``
    measures and renders every cell as an object of its own: 0.45 s for a thousand jobs, most of the command.)
    ``width``: the console's; the name column is cut to fit it."""
    shown = [s for s in ALL_STATUSES if any(j["counts"].get(s.value) for j in summaries)]
    columns = (*JOBS_COLUMNS[:_BEFORE_COUNTS], *(s.value for s in shown), *JOBS_COLUMNS[_BEFORE_COUNTS:])
    right = {"id", "subjobs", "elapsed", *(s.value for s in shown)}
    rows: list[list[tuple[str, str | None]]] = []
    for j in summaries:
        c = j["counts"]
        rows.append([(j["fqid"], None), (safe(j["name"]), None), (safe(j.get("owner") or "-"), None),
                     (j["status"], STYLES[JobStatus(j["status"])]), (safe(j["backend"]), None),
                     (str(j["subjobs"]) if c else "", None),
                     *((str(c.get(s.value, "")), STYLES[s]) for s in shown),
                     (when(j["submitted_at"]), None), (duration(j["elapsed"]), None)])
    if len(summaries) > 1:
        totals = totals_of(summaries)
        rows.append([("", "bold"), (f"{len(summaries)} jobs", "bold"), ("", "bold"), ("", "bold"), ("", "bold"),
                     (str(totals["subjobs"]), "bold"),
                     *((str(totals["counts"].get(s.value, "")), "bold") for s in shown), ("", "bold"), ("", "bold")])
    widths = [max(len(col), *(len(row[k][0]) for row in rows)) for k, col in enumerate(columns)]
    name = columns.index("name")
    # two spaces between columns and none at the edges: with the owner column, the usual listing fits 80
    if width is not None and sum(widths) + 2 * (len(widths) - 1) > width:
        widths[name] = max(8, widths[name] - (sum(widths) + 2 * (len(widths) - 1) - width))
    text = Text(no_wrap=True, overflow="ignore")
    header: list[tuple[str, str | None]] = [(col, "bold") for col in columns]
    for row in [header, *rows]:
        for k, (cell, style) in enumerate(row):
            if k == name and len(cell) > widths[k]:
                cell = cell[:widths[k] - 1] + "\u2026"
            if k:
                text.append("  ")
            text.append(cell.rjust(widths[k]) if columns[k] in right else cell.ljust(widths[k]), style)
        text.append("\n")
    text.rstrip()
    return text


def totals_of(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Subjobs (a job without subjobs counts as one run) per status over the listed jobs."""
    counts: dict[str, int] = {}
    for j in summaries:
        for status, n in (j["counts"] or {j["status"]: 1}).items():
            counts[status] = counts.get(status, 0) + n
    return {"jobs": len(summaries), "subjobs": sum(counts.values()), "counts": counts}


def show(detail: dict[str, Any], out: Console, listed: bool = False) -> None:
    """The job's fields, then its subjobs: the first ones, or (``listed``) exactly those chosen."""
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
    if info.get("reason"):
        row("reason", Text(safe(info["reason"]), style="red"))
    for i, entry in enumerate(info.get("history", [])):
        row("history" if i == 0 else "", safe(", ".join(f"{k}={short(v, 80)}" for k, v in entry.items())))
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
        out.print(subjobs_table(detail["subjob_rows"]) if detail["subjob_rows"] else Text("no such subjobs"))
    elif detail["counts"]:
        _subjobs(detail, out)


def _subjobs(detail: dict[str, Any], out: Console) -> None:
    out.print()
    out.print(subjobs_table(detail["subjob_rows"]))
    n = detail["subjobs"]
    rows = detail["subjob_rows"]
    if n > len(rows):
        out.print(Text(f"... and {n - len(rows)} more subjobs (orchestrator show {detail['fqid']} --all, "
                       f"or --status STATUS)", style="dim"))


def subjobs_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(box=None, header_style="bold", title=None)
    for col in ("id", "status", "args", "submits", "backend_id", "reason"):
        table.add_column(col, no_wrap=col in ("id", "status", "submits"), overflow="fold")
    for sub in rows:
        table.add_row(sub["fqid"], status_text(sub["status"]), Text(safe(short(" ".join(sub["args"]), 60))),
                      str(sub["submits"]), Text(safe(sub["backend_id"] or "-")),
                      Text(safe(sub["reason"] or ""), style="red"))
    return table
