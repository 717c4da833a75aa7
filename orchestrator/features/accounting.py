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
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from ..api.orchestrator import Orchestrator
from ..api.usage import report
from ..cli import render
from ..cli.app import home_option, job_id_argument, run
from ..cli.commands import _lookup


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
        grid.add_row("job", Text(render.safe(f"{record['fqid']} ({record['name']}, {record['status']})")))
        grid.add_row("attempts", str(record["attempts"]))
        grid.add_row("cpu", f"{record['cpu']:.2f} s")
        grid.add_row("useful", Text(f"{record['useful']:.2f} s", style="green"))
        grid.add_row("wasted", Text(f"{record['wasted']:.2f} s", style="red" if record["wasted"] else ""))
        for cause, seconds in record["wasted_by_cause"].items():
            grid.add_row(Text(render.safe(f"  {cause}")), f"{seconds:.2f} s")
        grid.add_row("wall", f"{record['wall']:.2f} s (all attempts)")
        out.print(grid)

    run(home, body, refresh=True, read_only=True)
