"""``orchestrator workflow ...``: submit DØ workflows from TOML files, show, kill lines, release, export.

Each command opens the home (``--home`` here or on ``orchestrator``; default
``$ORCHESTRATOR_HOME`` or ``~/.orchestrator``) with its workflows, does its
work and closes it. A workflow advances while a command holds it open:
``submit``, ``kill-line``, ``release`` and ``restart`` start whatever became
ready before they return; ``wait`` (and ``submit --wait``) drives the
workflow until it needs the user. Errors a user can fix end with a one-line
message on stderr and exit code 2; ``wait`` exits 0 when the workflow
completed, 1 otherwise.

Wired into the main command by ``cli.add_command(workflow_group)``.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import anyio
import click
from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from ...api.orchestrator import Orchestrator
from ...cli.app import CliError, Group, home_of, home_option
from ...cli.render import console as _console
from ...cli.render import safe
from .handle import PackageView, WorkflowRun
from .runner import Workflows
from .toml import load_workflow

T = TypeVar("T")
STYLES = {"waiting": "dim", "ready": "cyan", "submitting": "cyan", "submitted": "cyan", "running": "yellow",
          "completing": "yellow", "completed": "green", "failed": "red", "killed": "magenta", "held": "bright_red",
          "blocked": "red"}


def _run(home: Path | None, body: Callable[[Workflows], Awaitable[T]], *, autorun: bool = False) -> T:
    """Open the home (as every ``orchestrator`` command does) and its workflows, run ``body``, close them."""

    async def with_workflows(orch: Orchestrator) -> T:
        async with Workflows(orch, autorun=autorun) as wfs:
            await orch.transport.refresh()  # the backends' news first: statuses are current
            return await body(wfs)

    path = home_of(home)

    async def main() -> T:
        async with Orchestrator(home=path, service=False) as orch:  # workflows need the home itself
            return await with_workflows(orch)

    return anyio.run(main)


def _lookup(wfs: Workflows, wf_id: str) -> WorkflowRun:
    run = wfs.get(wf_id)
    if run is None:
        raise CliError(f"no workflow {wf_id!r} in this home")
    return run


def _state(state: str) -> Text:
    return Text(state, style=STYLES.get(state, ""))


@click.group("workflow", cls=Group)
def workflow_group() -> None:
    """Multi-stage workflows whose dependencies follow from the files packages produce and consume."""


@workflow_group.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--wait", "wait_", is_flag=True, help="Then drive the workflow until it needs the user (as 'wait').")
@click.option("--timeout", type=float, default=None, help="With --wait: give up after this many seconds.")
@home_option
def submit(file: Path, wait_: bool, timeout: float | None, home: Path | None) -> None:
    """Submit the workflow described by FILE (TOML); print its id."""
    workflow = load_workflow(file)  # before the home is opened: a bad file leaves nothing behind

    async def body(wfs: Workflows) -> int:
        run = await wfs.submit(workflow)
        click.echo(run.id)
        return await _follow(run, timeout) if wait_ else 0

    click.get_current_context().exit(_run(home, body, autorun=wait_))


@workflow_group.command("list")
@home_option
def list_(home: Path | None) -> None:
    """List the workflows with their status and package counts."""

    async def body(wfs: Workflows) -> None:
        console = _console()
        if not len(wfs):
            console.print("no workflows")
        for run in wfs:
            states = run.assess().states
            counts = {s: sum(1 for v in states.values() if v == s) for s in dict.fromkeys(states.values())}
            line = Text(f"{run.id}  ").append_text(_state(run.status)).append(f"  {len(states)} packages:")
            for s, n in counts.items():
                line.append(" ").append_text(_state(f"{s} {n}"))
            console.print(line, soft_wrap=True)

    _run(home, body)


@workflow_group.command()
@click.argument("wf_id", metavar="ID")
@home_option
def show(wf_id: str, home: Path | None) -> None:
    """Show a workflow as a tree: stages, lines, packages with their status, job and waits."""

    async def body(wfs: Workflows) -> None:
        _console().print(render_tree(_lookup(wfs, wf_id)))

    _run(home, body)


def render_tree(run: WorkflowRun) -> Tree:
    """The workflow's tree, one row per package."""
    spec = run.spec
    head = Text(f"workflow {safe(run.id)}  ", style="bold").append_text(_state(run.status))
    facts = [f"originator {spec.originator or '-'}", f"priority {spec.priority}",
             f"slots {spec.slots or '-'}", "held" if run.hold_flag else ""]
    head.append(safe("  " + ", ".join(f for f in facts if f)), style="dim")
    tree = Tree(head)
    tree.add(Text(safe(f"data {run.datadir}"), style="dim"))
    packages = run.packages
    for stage in spec.stages:
        st = tree.add(Text(safe(f"stage {stage.id}" + (f" ({stage.name})" if stage.name else "")), style="bold"))
        for line in stage.lines:
            label = f"line {stage.id}.{line.id}" + (" early_start" if line.early_start else "")
            ln = st.add(Text(safe(label)))
            for pkg in line.packages:
                ln.add(_package_row(packages[f"{stage.id}.{line.id}.{pkg.id}"]))
    return tree


def _package_row(p: PackageView) -> Text:
    row = Text(f"package {safe(p.key)}  ").append_text(_state(p.state))
    binaries = " | ".join(b.name or Path(b.executable).name for b in p.spec.binaries)
    row.append(safe(f"  [{binaries}]"))
    if p.job is not None:
        row.append(f"  job {p.job.fqid}, {p.job.info.submit_counter} submit(s)", style="dim")
    if p.spec.priority:
        row.append(f"  priority {p.spec.priority}", style="dim")
    if p.hold:
        row.append("  hold", style="bright_red")
    if p.state in ("waiting", "held") and p.waiting_for:
        shown = ", ".join(p.waiting_for[:4]) + (f" (+{len(p.waiting_for) - 4})" if len(p.waiting_for) > 4 else "")
        row.append(safe(f"  waits for {shown}"), style="dim")
    reason = p.job.info.reason if p.job is not None else None
    if p.state == "failed":
        reason = reason or next((e["reason"] for e in reversed(p.history)), None)
    if reason and p.state in ("failed", "held", "killed"):
        row.append(f"  {safe(reason)}", style="red")
    return row


@workflow_group.command()
@click.argument("wf_id", metavar="ID")
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds (exit code 1).")
@home_option
def wait(wf_id: str, timeout: float | None, home: Path | None) -> None:
    """Drive a workflow until it needs the user; exit 0 if it completed, else 1."""
    click.get_current_context().exit(_run(home, lambda wfs: _follow(_lookup(wfs, wf_id), timeout), autorun=True))


async def _follow(run: WorkflowRun, timeout: float | None) -> int:
    try:
        status = await run.wait(timeout=math.inf if timeout is None else timeout)
    except TimeoutError:
        Console(stderr=True).print(Text(f"timed out after {timeout:g} s; workflow {run.id} is {run.status}",
                                        style="yellow"), soft_wrap=True)
        return 1
    _console().print(Text(f"workflow {run.id} ").append_text(_state(status)), soft_wrap=True)
    return 0 if status == "completed" else 1


@workflow_group.command("kill-line")
@click.argument("wf_id", metavar="ID")
@click.argument("line", metavar="STAGE.LINE")
@click.option("--drop-outputs", is_flag=True,
              help="Remove the line's future outputs from downstream inputs: consumers may start without them.")
@home_option
def kill_line(wf_id: str, line: str, drop_outputs: bool, home: Path | None) -> None:
    """Kill the packages of a line that have not completed."""
    stage, sep, line_id = line.partition(".")
    if not sep or not stage or not line_id or "." in line_id:
        raise click.BadParameter(f"expected STAGE.LINE (e.g. 1.3), not {line!r}", param_hint="STAGE.LINE")

    async def body(wfs: Workflows) -> None:
        killed = await _lookup(wfs, wf_id).kill_line(stage, line_id, drop_outputs=drop_outputs)
        what = ", ".join(killed) or "nothing (every package had completed)"
        click.echo(f"workflow {wf_id}: line {line} killed: {what}" + ("; outputs dropped" if drop_outputs else ""))

    _run(home, body)


@workflow_group.command()
@click.argument("wf_id", metavar="ID")
@click.argument("package", required=False)
@home_option
def release(wf_id: str, package: str | None, home: Path | None) -> None:
    """Release a held workflow (and its held packages), or one PACKAGE (STAGE.LINE.PACKAGE)."""

    async def body(wfs: Workflows) -> None:
        run = _lookup(wfs, wf_id)
        await run.release(package)
        click.echo(f"workflow {wf_id}: released{f' package {package}' if package else ''}; {run.status}")

    _run(home, body)


@workflow_group.command()
@click.argument("wf_id", metavar="ID")
@click.argument("package", required=False)
@home_option
def hold(wf_id: str, package: str | None, home: Path | None) -> None:
    """Hold a workflow, or one PACKAGE: nothing more of it starts until released."""

    async def body(wfs: Workflows) -> None:
        await _lookup(wfs, wf_id).hold(package)
        click.echo(f"workflow {wf_id}: held{f' package {package}' if package else ''}")

    _run(home, body)


@workflow_group.command()
@click.argument("wf_id", metavar="ID")
@click.argument("package")
@home_option
def restart(wf_id: str, package: str, home: Path | None) -> None:
    """Restart a failed or killed PACKAGE; it resumes at its first unfinished binary."""

    async def body(wfs: Workflows) -> None:
        run = _lookup(wfs, wf_id)
        await run.restart(package)
        click.echo(f"workflow {wf_id}: package {package} restarted; {run.packages[package].state}")

    _run(home, body)


@workflow_group.command()
@click.argument("wf_id", metavar="ID")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the DAG here, with a submit file and a script per package next to it.")
@home_option
def dagman(wf_id: str, output: Path | None, home: Path | None) -> None:
    """Export the implied DAG as an HTCondor DAGMan file (stdout without -o)."""

    async def body(wfs: Workflows) -> None:
        run = _lookup(wfs, wf_id)
        if output is None:
            click.echo(run.dagman(), nl=False)
        else:
            click.echo(str(run.write_dagman(output)))

    _run(home, body)
