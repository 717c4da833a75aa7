"""``orchestrator story ID``: what happened to a job or subjob lately, one line per entry, in order.

The lines are ``orch.story(ID)``'s entries (:mod:`orchestrator.runtime.story`):
the time, the stimulus id that ties a request to its instructions, the
backend's outcomes and the changes they made, the kind, the type and what it
said. The story lives in the memory of the process that holds the home (the
service, when one does), so a command that opened the home itself has only
what happened since; it says so rather than print nothing.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import click

from ..api.orchestrator import Orchestrator
from . import render
from .app import home_option, job_id_argument, run
from .commands import cli, print_json
from .targets import lookup


def _when(ts: float, now: dt.datetime) -> str:
    """``14:03:07.123`` today, ``2026-11-24 14:03:07.123`` before: the steps of one request are milliseconds
    apart, so the time says down to the millisecond what ``render.when`` rounds away."""
    at = dt.datetime.fromtimestamp(ts)
    shown = at.strftime("%H:%M:%S.%f")[:-3]
    return shown if at.date() == now.date() else f"{at:%Y-%m-%d} {shown}"


def lines(entries: list[dict[str, Any]]) -> list[str]:
    """One aligned line per entry: time, stimulus id, kind, type, description (escaped: a reason is a backend's
    text)."""
    now = dt.datetime.now()
    rows = [(_when(e["time"], now), render.safe(e["stimulus_id"]), e["kind"], e["type"], render.safe(e["description"]))
            for e in entries]
    widths = [max((len(r[k]) for r in rows), default=0) for k in range(4)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r[:4], widths, strict=True)) + "  " + r[4] for r in rows]


@cli.command()
@job_id_argument
@click.option("--json", "as_json", is_flag=True, help='{"schema", "fqid", "story": [...]} instead of the lines.')
@home_option
def story(job_id: str, as_json: bool, home: Path | None) -> None:
    """What happened to a job or subjob lately: every event, status change, refusal and instruction that touched
    it, oldest first, one a line with its time and stimulus id ([core] story_length steps are kept, in the memory
    of the service or of the process that holds the home)."""

    async def body(orch: Orchestrator) -> None:
        job = lookup(orch, job_id)
        entries = await orch.story(job)
        if as_json:
            print_json({"schema": 1, "fqid": job.fqid, "story": entries})
            return
        if not entries:
            why = ("the service kept no step that touched it since it started (it keeps the newest [core] "
                   "story_length)" if orch.remote else
                   "a story is kept in memory by the process that holds the home, and this command opened it "
                   "itself just now (a service, 'orchestrator serve', keeps every job's from its start)")
            click.echo(f"job {job.fqid}: nothing kept: {why}")
            return
        for line in lines(entries):
            click.echo(line.rstrip())

    run(home, body, read_only=True)
