"""Useful and wasted CPU (GBS): what each attempt of a run cost, and whether it served the result.

The job wrapper appends one record per attempt to the run's output dir,
``orch.usage`` (see ``orchestrator/scripts/wrapper.sh``): the attempt, the saved
state it started from and the newest one when it stopped, its start and end,
its exit code, and the shell's ``times`` (its own and its children's user and
system CPU). An attempt is **useful** when it ended in success (exit code 0)
or when a later attempt resumed from a state it saved; every other attempt
is **wasted**, and is charged to its cause: the failure history entry of that
attempt (``level: verdict``), else ``killed`` for an attempt stopped by a
signal. ``orchestrator report ID`` prints it per master and per cause.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from ..api.job import Job
from ..api.orchestrator import Orchestrator
from ..cli import render
from ..cli.app import home_option, job_id_argument, run
from ..cli.commands import _lookup


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt's own record."""

    attempt: int
    started_from: int
    newest: int
    start: float
    end: float
    code: int
    cpu: float

    @property
    def wall(self) -> float:
        return max(0.0, self.end - self.start)


def _seconds(text: str) -> float:
    """``1m2.500000s`` (the shell's ``times``) in seconds."""
    minutes, _, rest = text.rstrip("s").partition("m")
    return float(minutes) * 60 + float(rest)


def parse_usage(text: str) -> list[Attempt]:
    """The records of an ``orch.usage`` file (a head line and two lines of ``times``); a torn record is skipped."""
    lines = text.splitlines()
    out: list[Attempt] = []
    i = 0
    while i < len(lines):
        try:
            head = lines[i].split()
            attempt, started_from, newest, code = int(head[0]), int(head[1]), int(head[2]), int(head[5])
            start, end = float(head[3]), float(head[4])
            own, children = lines[i + 1].split(), lines[i + 2].split()
            cpu = sum(_seconds(t) for t in (*own[:2], *children[:2]))
        except (ValueError, IndexError):
            i += 1
            continue
        out.append(Attempt(attempt, started_from, newest, start, end, code, cpu))
        i += 3
    return out


def judge(attempts: Sequence[Attempt], history: Sequence[Mapping[str, Any]]) -> list[tuple[Attempt, str | None]]:
    """Each attempt with ``None`` (useful) or the cause it is wasted for."""
    causes = {int(h["attempt"]): f"{h.get('level', '?')}: {h.get('verdict', '?')}" for h in history
              if "attempt" in h and h.get("verdict") not in ("refused",)}
    out: list[tuple[Attempt, str | None]] = []
    for a in attempts:
        resumed = any(b.attempt > a.attempt and a.started_from < b.started_from <= a.newest for b in attempts)
        if a.code == 0 or resumed:
            out.append((a, None))
        else:
            out.append((a, causes.get(a.attempt) or ("killed" if a.code >= 128 else f"exit code {a.code}")))
    return out


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
            text = (Path(run_.outputdir) / "orch.usage").read_text(errors="replace")
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


@click.command("report")
@job_id_argument
@click.option("--json", "as_json", is_flag=True, help="A JSON document (docs/reference.md) instead of the text.")
@home_option
def report_command(job_id: str, as_json: bool, home: Path | None) -> None:
    """Useful and wasted CPU of a job: per master, and the wasted part per failure cause."""

    async def body(orch: Orchestrator) -> None:
        record = report(_lookup(orch, job_id))
        if as_json:
            click.echo(json.dumps(record, indent=1))
            return
        out = render.console()
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column(justify="right")
        grid.add_row("job", f"{record['fqid']} ({record['name']}, {record['status']})")
        grid.add_row("attempts", str(record["attempts"]))
        grid.add_row("cpu", f"{record['cpu']:.2f} s")
        grid.add_row("useful", Text(f"{record['useful']:.2f} s", style="green"))
        grid.add_row("wasted", Text(f"{record['wasted']:.2f} s", style="red" if record["wasted"] else ""))
        for cause, seconds in record["wasted_by_cause"].items():
            grid.add_row(f"  {cause}", f"{seconds:.2f} s")
        grid.add_row("wall", f"{record['wall']:.2f} s (all attempts)")
        out.print(grid)

    run(home, body, refresh=True, read_only=True)
