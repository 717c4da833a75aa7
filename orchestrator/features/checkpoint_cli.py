"""``orchestrator checkpoint list|get``: the saved states of a job (DataGrid's ``dg-get-job-chkpt``).

``get`` writes a state in the one format the State API reads and writes, so
the file it makes is what ``orchestrator resubmit ID --from-state FILE``
starts a job from. The group reaches the CLI through the entry-point group
``orchestrator.commands`` (as a plugin's commands do).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from ..api.orchestrator import Orchestrator
from ..checkpoint import State
from ..cli import render
from ..cli.app import CliError, home_option, job_id_argument, run
from ..cli.commands import _lookup
from ..runtime.repository import StateRow


@click.group()
def checkpoint() -> None:
    """Saved states of checkpointing jobs: list them, fetch one to resubmit from."""


def _describe(row: StateRow) -> tuple[str, str]:
    """Position and variables of a state, for a listing."""
    state = State.from_text(row.data, fqid=row.job)
    step = state.current_step
    where = f"{state.position}/{len(state.steps)}" + (f" (step {step})" if step is not None else "")
    values = " ".join(f"{k}={v}" for k, v in state.values.items())
    return where, render.short(values, 80)


@checkpoint.command("list")
@job_id_argument
@home_option
def list_states(job_id: str, home: Path | None) -> None:
    """List the states kept for a job, oldest first; for a master, each subjob's newest state."""

    async def body(orch: Orchestrator) -> None:
        job = _lookup(orch, job_id)
        if job.parent is None and len(job.subjobs):
            rows = [StateRow(**kept[-1]) for sub in job.subjobs if (kept := await sub.states())]
        else:
            rows = [StateRow(**r) for r in await job.states()]
        console = render.console()
        links = job.info.partition
        if "phase" in links:  # a partitioned master: where its pre-job and aggregator are
            parts = [f"phase {links['phase']}"]
            for role in ("prejob", "aggregator"):
                linked = orch.jobs.get(links[role]) if role in links else None
                if linked is not None:
                    parts.append(f"{role} {linked.fqid} ({linked.status.value})")
            console.print(f"job {job.fqid}: " + ", ".join(parts))
        if not rows:
            console.print(f"job {job.fqid}: no saved state")
            return
        table = Table(box=None, header_style="bold")
        for col in ("label", "saved", "final", "steps done", "bytes", "values"):
            table.add_column(col, no_wrap=col != "values", overflow="fold")
        for row in rows:
            where, values = _describe(row)
            saved = dt.datetime.fromtimestamp(row.time).astimezone().isoformat(timespec="seconds") if row.time else "-"
            table.add_row(Text(render.safe(row.label)), saved, Text("yes", style="green") if row.final else "no",
                          Text(render.safe(where)), str(len(row.data.encode())), Text(render.safe(values)))
        console.print(table)

    run(home, body, refresh=True, read_only=True)


@checkpoint.command("get")
@job_id_argument
@click.option("--back", "back", type=click.IntRange(0, None), default=0, show_default=True,
              help="How many states before the newest (0: the newest, 1: the one before, ...).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the state to this file (default: standard output).")
@home_option
def get_state(job_id: str, back: int, output: Path | None, home: Path | None) -> None:
    """Fetch a saved state of a job or subjob, to read it or to resubmit from it (--from-state)."""

    async def body(orch: Orchestrator) -> str:
        job = _lookup(orch, job_id)
        if job.parent is None and len(job.subjobs):
            raise CliError(f"job {job.fqid} is a master: its subjobs have the states (orchestrator checkpoint "
                           f"list {job.fqid} shows them)")
        rows = [StateRow(**r) for r in await job.states()]
        if not rows:
            raise CliError(f"job {job.fqid} has no saved state")
        if back >= len(rows):
            raise CliError(f"job {job.fqid} has {len(rows)} state(s) kept; --back {back} goes past the oldest")
        return rows[-1 - back].data

    data = run(home, body, refresh=True, read_only=True)
    if output is None:
        click.echo(data, nl=False)
    else:
        output.write_text(data, encoding="utf-8")
        click.echo(f"state {State.from_text(data).label} written to {output}", err=True)
