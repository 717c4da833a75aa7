"""``orchestrator workflow ...``: submit DØ workflows from TOML files, show, kill lines, release, export.

Each command opens the home (``--home`` here or on ``orchestrator``; default
``$ORCHESTRATOR_HOME`` or ``~/.orchestrator``) with its workflows, does its
work and closes it. A workflow advances while a command holds it open:
``submit``, ``kill-line``, ``release`` and ``restart`` start whatever became
ready before they return; ``wait`` (and ``submit --wait``) drives the
workflow until it needs the user.

While a service holds the home (or with ``--url``), every command is a
request to it, as the job commands are (``POST /api/workflow/<command>``):
the service runs the same command on its own workflows, as the caller sees
them (a user their own workflows, an admin every one; a workflow submitted
by a user is theirs, and so are its packages' jobs), and sends back what it
printed. So the users a team's service admits use workflows without any
access to the home's files. Errors a user can fix end with a one-line
message on stderr and exit code 2; ``wait`` exits 0 when the workflow
completed, 1 otherwise.

Wired into the main command by ``cli.add_command(workflow_group)``.
"""

from __future__ import annotations

import inspect
import io
import math
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import anyio
import click
from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from ...api.client import ServiceClient, connect
from ...api.orchestrator import Orchestrator
from ...api.owners import Caller
from ...api.watcher import ask_to_leave
from ...api.wire import RefreshRequest
from ...cli.app import CliError, Group, home_of, home_option, remote_of
from ...cli.render import console as _console
from ...cli.render import safe
from ...core.errors import HomeLockedError
from .handle import PackageView, WorkflowRun
from .model import Workflow
from .runner import Workflows
from .toml import load_workflow
from .values import WorkflowError

STYLES = {"waiting": "dim", "ready": "cyan", "submitting": "cyan", "submitted": "cyan", "running": "yellow",
          "completing": "yellow", "completed": "green", "failed": "red", "killed": "magenta", "held": "bright_red",
          "blocked": "red"}


class Out:
    """Where a command writes: this terminal, or (in the service) a record of it sent back to the client."""

    def __init__(self, record: bool = False, width: int = 120) -> None:
        self.chunks: list[list[str]] | None = [] if record else None
        self.width = width

    def echo(self, text: str) -> None:
        """Plain text, one line."""
        if self.chunks is None:
            click.echo(text)
        else:
            self.chunks.append(["text", text + "\n"])

    def print(self, renderable: Any, *, err: bool = False) -> None:
        """Rich output (styles kept as ANSI in a record, for the client's console to show or drop)."""
        if self.chunks is None:
            (Console(stderr=True) if err else _console()).print(renderable, soft_wrap=True)
            return
        buffer = io.StringIO()
        Console(file=buffer, force_terminal=True, color_system="standard", width=self.width,
                highlight=False).print(renderable, soft_wrap=True, end="")
        self.chunks.append(["err" if err else "rich", buffer.getvalue().rstrip("\n")])


class Runs(Protocol):
    """The workflows a command sees: all of a home opened here (:class:`Workflows`), or a caller's (:class:`Mine`)."""

    def get(self, wf_id: str) -> WorkflowRun | None: ...
    def __iter__(self) -> Iterator[WorkflowRun]: ...
    def __len__(self) -> int: ...
    async def submit(self, workflow: Workflow) -> WorkflowRun: ...


class Mine:
    """A service's workflows as one caller sees them: their own (every one for an admin)."""

    def __init__(self, wfs: Workflows, caller: Caller) -> None:
        self.wfs, self.caller = wfs, caller

    def _sees(self, run: WorkflowRun) -> bool:
        return self.caller.admin or (run.owner or self.wfs.orch.user) == self.caller.name

    def get(self, wf_id: str) -> WorkflowRun | None:
        run = self.wfs.get(wf_id)
        return run if run is not None and self._sees(run) else None

    def __iter__(self) -> Iterator[WorkflowRun]:
        return iter([run for run in self.wfs if self._sees(run)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    async def submit(self, workflow: Workflow) -> WorkflowRun:
        if workflow.id is not None and workflow.id in self.wfs and self.get(workflow.id) is None:
            raise CliError(f"workflow id {workflow.id!r} is taken in this home: choose another")
        return await self.wfs.submit(workflow, owner=self.caller.name)


Command = Callable[..., Awaitable[int | None]]
#: The commands, by name: each runs on a home's workflows (here, or in the service for its caller).
COMMANDS: dict[str, Command] = {}


def command(name: str) -> Callable[[Command], Command]:
    def register(f: Command) -> Command:
        COMMANDS[name] = f
        return f

    return register


def _run(home: Path | None, name: str, args: dict[str, Any], *, autorun: bool = False) -> int:
    """Run command ``name``: through the service when one holds the home (or ``--url``), else on the home here."""
    path = home_of(home)
    remote = remote_of()

    async def through(client: ServiceClient) -> int:
        async with client:
            answer = await client.call(f"workflow/{name}", **args, width=_console().width)
        _replay(answer["out"])
        return int(answer["code"] or 0)

    async def main() -> int:
        client = (ServiceClient(url=remote["url"], token=remote["token"], ca=remote["ca"]) if remote
                  else await connect(path))
        if client is not None:
            return await through(client)
        try:
            async with Orchestrator(home=path, service=False) as orch, Workflows(orch, autorun=autorun) as wfs:
                await orch.transport.handle(RefreshRequest())  # the backends' news first: statuses are current
                return int(await COMMANDS[name](wfs, Out(), **args) or 0)
        except HomeLockedError:  # a service took the home meanwhile (its watcher, starting): through it
            client = await connect(path)
            if client is None:
                raise
            return await through(client)

    return anyio.run(main)


def _replay(chunks: list[list[str]]) -> None:
    """What the service's command printed, here: plain text as it is; rich output restyled for this console."""
    for kind, text in chunks:
        if kind == "text":
            click.echo(text, nl=False)
        else:
            (Console(stderr=True) if kind == "err" else _console()).print(Text.from_ansi(text), soft_wrap=True)


async def serve_command(wfs: Workflows, caller: Caller, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """In the service: run command ``name`` for ``caller`` on its workflows; what it printed and its exit code.
    A refusal raises :class:`~orchestrator.core.errors.OrchestratorError` (the API answers 409, or 400)."""
    found = COMMANDS.get(name)
    if found is None:
        raise KeyError(f"no workflow command {name!r}")
    width = args.pop("width", 120)
    out = Out(record=True, width=width if isinstance(width, int) and 40 <= width <= 1000 else 120)
    inspect.signature(found).bind(Mine(wfs, caller), out, **args)  # TypeError: arguments that do not fit
    try:
        code = await found(Mine(wfs, caller), out, **args)
    except click.ClickException as exc:
        raise WorkflowError(exc.message) from None
    except (ValueError, TypeError, AttributeError, KeyError) as exc:  # arguments of the wrong shape: refused
        raise WorkflowError(f"workflow {name}: {type(exc).__name__}: {exc}") from None
    return {"out": out.chunks, "code": int(code or 0)}


def _lookup(wfs: Runs, wf_id: str) -> WorkflowRun:
    run = wfs.get(str(wf_id))
    if run is None:
        raise CliError(f"no workflow {wf_id!r} in this home")
    return run


def _state(state: str) -> Text:
    return Text(state, style=STYLES.get(state, ""))


def _portable(workflow: Workflow) -> dict[str, Any]:
    """The workflow as the service gets it: its input files' locators made absolute here, where they were named."""
    spec = workflow.normalized()
    for _, _, _, p in spec.packages():
        for b in p.binaries:
            for f in b.inputs:
                if f.locator is not None:
                    f.locator = os.path.abspath(os.path.expanduser(f.locator))
    return spec.to_dict()


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
    args = {"workflow": _portable(workflow), "wait": wait_, "timeout": timeout}
    click.get_current_context().exit(_run(home, "submit", args, autorun=wait_))


@command("submit")
async def _submit(wfs: Runs, out: Out, workflow: dict[str, Any], wait: bool = False,
                  timeout: float | None = None) -> int:
    run = await wfs.submit(Workflow.from_dict(workflow))
    out.echo(run.id)
    return await _follow(run, out, timeout) if wait else 0


@workflow_group.command("list")
@home_option
def list_(home: Path | None) -> None:
    """List the workflows with their status and package counts."""
    _run(home, "list", {})


@command("list")
async def _list(wfs: Runs, out: Out) -> None:
    if not len(wfs):
        out.print(Text("no workflows"))
    for run in wfs:
        states = run.assess().states
        counts = {s: sum(1 for v in states.values() if v == s) for s in dict.fromkeys(states.values())}
        line = Text(f"{safe(run.id)}  ").append_text(_state(run.status)).append(f"  {len(states)} packages:")
        for s, n in counts.items():
            line.append(" ").append_text(_state(f"{s} {n}"))
        if run.owner:
            line.append(f"  owner {safe(run.owner)}", style="dim")
        out.print(line)


@workflow_group.command()
@click.argument("wf_id", metavar="ID")
@home_option
def show(wf_id: str, home: Path | None) -> None:
    """Show a workflow as a tree: stages, lines, packages with their status, job and waits."""
    _run(home, "show", {"wf_id": wf_id})


@command("show")
async def _show(wfs: Runs, out: Out, wf_id: str) -> None:
    out.print(render_tree(_lookup(wfs, wf_id)))


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
    click.get_current_context().exit(_run(home, "wait", {"wf_id": wf_id, "timeout": timeout}, autorun=True))


@command("wait")
async def _wait(wfs: Runs, out: Out, wf_id: str, timeout: float | None = None) -> int:
    return await _follow(_lookup(wfs, wf_id), out, timeout)


async def _follow(run: WorkflowRun, out: Out, timeout: float | None) -> int:
    try:
        status = await run.wait(timeout=math.inf if timeout is None else timeout)
    except TimeoutError:
        out.print(Text(f"timed out after {timeout:g} s; workflow {safe(run.id)} is {run.status}", style="yellow"),
                  err=True)
        return 1
    out.print(Text(f"workflow {safe(run.id)} ").append_text(_state(status)))
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
    _run(home, "kill-line", {"wf_id": wf_id, "line": line, "drop_outputs": drop_outputs})


@command("kill-line")
async def _kill_line(wfs: Runs, out: Out, wf_id: str, line: str, drop_outputs: bool = False) -> None:
    stage, _, line_id = str(line).partition(".")
    killed = await _lookup(wfs, wf_id).kill_line(stage, line_id, drop_outputs=bool(drop_outputs))
    what = ", ".join(killed) or "nothing (every package had completed)"
    out.echo(safe(f"workflow {wf_id}: line {line} killed: {what}" + ("; outputs dropped" if drop_outputs else "")))


def _hold_command(name: str, doc: str) -> None:
    """``release`` and ``hold``: the same arguments, sent the same way."""

    @workflow_group.command(name=name, help=doc)
    @click.argument("wf_id", metavar="ID")
    @click.argument("package", required=False)
    @home_option
    def run(wf_id: str, package: str | None, home: Path | None) -> None:
        _run(home, name, {"wf_id": wf_id, "package": package})


_hold_command("release", "Release a held workflow (and its held packages), or one PACKAGE (STAGE.LINE.PACKAGE).")
_hold_command("hold", "Hold a workflow, or one PACKAGE: nothing more of it starts until released.")


@command("release")
async def _release(wfs: Runs, out: Out, wf_id: str, package: str | None = None) -> None:
    run = _lookup(wfs, wf_id)
    await run.release(package)
    out.echo(safe(f"workflow {wf_id}: released{f' package {package}' if package else ''}; {run.status}"))


@command("hold")
async def _hold(wfs: Runs, out: Out, wf_id: str, package: str | None = None) -> None:
    await _lookup(wfs, wf_id).hold(package)
    out.echo(safe(f"workflow {wf_id}: held{f' package {package}' if package else ''}"))


@workflow_group.command()
@click.argument("wf_id", metavar="ID")
@click.argument("package")
@home_option
def restart(wf_id: str, package: str, home: Path | None) -> None:
    """Restart a failed or killed PACKAGE; it resumes at its first unfinished binary."""
    _run(home, "restart", {"wf_id": wf_id, "package": package})


@command("restart")
async def _restart(wfs: Runs, out: Out, wf_id: str, package: str) -> None:
    run = _lookup(wfs, wf_id)
    await run.restart(package)
    out.echo(safe(f"workflow {wf_id}: package {package} restarted; {run.packages[package].state}"))


@workflow_group.command()
@click.argument("wf_id", metavar="ID")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the DAG here, with a submit file and a script per package next to it.")
@home_option
def dagman(wf_id: str, output: Path | None, home: Path | None) -> None:
    """Export the implied DAG as an HTCondor DAGMan file (stdout without -o)."""
    if output is None:
        _run(home, "dagman", {"wf_id": wf_id})
        return
    path = home_of(home)
    ask_to_leave(path)  # the home's watcher, if it holds the home, lets this command have it

    async def main() -> None:  # files written here: on the home itself (a service's would write as itself)
        async with Orchestrator(home=path, service=False) as orch, Workflows(orch, autorun=False) as wfs:
            click.echo(str(_lookup(wfs, wf_id).write_dagman(output)))

    anyio.run(main)


@command("dagman")
async def _dagman(wfs: Runs, out: Out, wf_id: str) -> None:
    text = _lookup(wfs, wf_id).dagman()
    if out.chunks is None:
        click.echo(text, nl=False)
    else:
        out.chunks.append(["text", text])
