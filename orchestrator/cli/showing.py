"""``orchestrator show``'s text: a job's fields, then a master's subjobs in sacct's columns (:mod:`.columns`)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .columns import SUBJOBS, table
from .render import counts_text, duration, safe, short, status_text, when


def show(detail: dict[str, Any], out: Console, listed: bool = False, fields: Sequence[str] | None = None) -> None:
    """The job's fields, then its subjobs: the first ones, or (``listed``) exactly those chosen; ``fields``: the
    subjobs' columns (:mod:`.columns`, ``show --format``)."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")  # a long path or reason is folded onto the next line, never cut with "…"

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
    return table(rows, list(fields or SUBJOBS), width)
