"""The ``orchestrator`` command: submit, list, show, kill, resubmit, remove and wait for jobs.

Each command opens the orchestrator home (``--home``; default
``$ORCHESTRATOR_HOME`` or ``~/.orchestrator``) for as long as it runs, and
closes it; runs already at a backend carry on in between. Refused
operations, bad job files, a busy home and unknown ids end with a one-line
message on stderr and exit code 2. ``wait`` (and ``submit --wait``, ``demo``)
exits 0 when the job ended completed, 1 otherwise.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import shlex
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from stevedore import ExtensionManager

from .errors import OrchestratorError
from .ids import fqid_str, parse_fqid
from .job import Job
from .jobfile import demo_job_text, load_job
from .logs import configure as configure_logs
from .orchestrator import Orchestrator
from .status import ALL_STATUSES, FINAL, JobStatus

T = TypeVar("T")
S = JobStatus
#: Seconds between two refreshes of the live display.
POLL = 0.2
#: Subjobs listed by ``show`` on a master.
SHOW_SUBJOBS = 50
STYLES = {S.NEW: "dim", S.SUBMITTING: "cyan", S.SUBMITTED: "cyan", S.RUNNING: "yellow", S.COMPLETING: "yellow",
          S.COMPLETED: "green", S.FAILED: "red", S.KILLED: "magenta", S.HELD: "bright_red"}


# ------------------------------------------------------------------ plumbing
class CliError(click.ClickException):
    """A one-line red message on stderr, exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        Console(stderr=True).print(Text(f"error: {self.message}", style="red"), soft_wrap=True, highlight=False)


class _Group(click.Group):
    """Turns the errors a user can cause (and fix) into ``CliError``; anything else is a bug: traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OSError as exc:
            raise CliError(f"{exc.filename}: {exc.strerror or exc}" if exc.filename else str(exc)) from exc
        except OrchestratorError as exc:
            raise CliError(str(exc)) from exc


def _job_id(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``3`` or ``3.1``, normalised; anything else is a usage error."""
    try:
        return fqid_str(parse_fqid(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def job_id_argument(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.argument("job_id", metavar="ID", callback=_job_id)(f)


def home_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--home", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help="Orchestrator home (default: $ORCHESTRATOR_HOME or ~/.orchestrator).")(f)


def _console() -> Console:
    """Standard output; wide tables when it is not a terminal, so that a pipe gets whole lines."""
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=160)
    return console


def _run(home: Path | None, body: Callable[[Orchestrator], Awaitable[T]]) -> T:
    """Open the home, run ``body``, close the home."""
    if home is None:
        home = click.get_current_context().find_root().params.get("home")

    async def main() -> T:
        async with Orchestrator(home=home) as orch:
            return await body(orch)

    return anyio.run(main)


def _lookup(orch: Orchestrator, ident: str) -> Job:
    try:
        return orch.jobs(ident)
    except KeyError:
        raise CliError(f"no job {ident}") from None


async def _refresh(orch: Orchestrator) -> None:
    """Ask each backend once for news before a listing, and let mergers this starts finish."""
    await orch.engine.poll_once()
    for _ in range(5):  # the engine applies the reports in its own task
        await anyio.lowlevel.checkpoint()
    await _settle(orch)


async def _settle(orch: Orchestrator) -> None:
    """Let mergers due on jobs that just ended run before the home is closed (else they would be lost)."""
    for job in orch.jobs:
        if not job.is_active():
            with anyio.move_on_after(30):
                await job.wait()


def _counts(orch: Orchestrator, job: Job) -> dict[JobStatus, int]:
    """Per-status subjob counts of a master (from the counters), or ``{status: 1}`` for a runnable job."""
    fq = job.fqid_tuple
    sm = orch.engine.sm
    if len(fq) == 1 and sm.is_master(fq[0]):
        return sm.master(fq[0]).count_map()
    return {job.status: 1}


def _counts_text(counts: Mapping[JobStatus, int]) -> Text:
    text = Text()
    for status in ALL_STATUSES:
        if counts.get(status):
            if text:
                text.append("  ")
            text.append(f"{status.value} {counts[status]}", style=STYLES[status])
    return text


def _status(status: JobStatus) -> Text:
    return Text(status.value, style=STYLES[status])


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).astimezone().isoformat(timespec="milliseconds")


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------ commands
@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@home_option
@click.option("-v", "--verbose", is_flag=True, help="Log the orchestrator's work (INFO) on stderr.")
def cli(home: Path | None, verbose: bool) -> None:
    """An asynchronous job orchestrator for batch and grid computing."""
    configure_logs(level="INFO" if verbose else "WARNING")


@cli.command()
@click.argument("jobfile", type=click.Path(path_type=Path))
@click.option("--keep-going/--no-keep-going", default=False, show_default=True,
              help="Submit every subjob even when some fail to submit.")
@click.option("--wait", "wait_", is_flag=True, help="Then follow the job until it ends (as 'wait').")
@click.option("--timeout", type=float, default=None, help="With --wait: give up after this many seconds.")
@home_option
def submit(jobfile: Path, keep_going: bool, wait_: bool, timeout: float | None, home: Path | None) -> None:
    """Add the job described by JOBFILE (TOML) and submit it; print its id."""
    job = load_job(jobfile)  # before the home is opened: a bad file leaves nothing behind

    async def body(orch: Orchestrator) -> int:
        added = await orch.jobs.add(job)
        click.echo(added.id)  # before submit(): if that fails, the job still exists, and the error names it
        await added.submit(keep_going=keep_going)
        return await _follow(orch, added, timeout) if wait_ else 0

    click.get_current_context().exit(_run(home, body))


@cli.command()
@click.option("--status", "statuses", multiple=True, type=click.Choice([s.value for s in ALL_STATUSES]),
              help="Only jobs in this status (repeatable).")
@click.option("--name", default=None, help="Only jobs whose name matches this glob.")
@home_option
def jobs(statuses: tuple[str, ...], name: str | None, home: Path | None) -> None:
    """List the top-level jobs with their subjob counts per status."""

    async def body(orch: Orchestrator) -> None:
        await _refresh(orch)
        selected = list(orch.jobs.select(status=list(statuses) or None, name=name))
        console = _console()
        if not selected:
            console.print("no jobs")
            return
        counts = {j.fqid: _counts(orch, j) if orch.engine.sm.is_master(j.fqid_tuple[0]) else {} for j in selected}
        shown = [s for s in ALL_STATUSES if any(c.get(s) for c in counts.values())]
        table = Table(box=None, header_style="bold")
        for col in ("id", "name", "status", "backend", "subjobs", *(s.value for s in shown)):
            numeric = col in ("id", "subjobs") or col in {s.value for s in shown}
            table.add_column(col, justify="right" if numeric else "left", no_wrap=col != "name")
        for j in selected:
            c = counts[j.fqid]
            cells = [Text(str(c.get(s, "")), style=STYLES[s]) for s in shown]
            table.add_row(j.fqid, Text(j.name), _status(j.status), Text(j.backend.name),
                          str(sum(c.values())) if c else "", *cells)
        console.print(table)

    _run(home, body)


@cli.command()
@job_id_argument
@home_option
def show(job_id: str, home: Path | None) -> None:
    """Show a job (ID: 3) or a subjob (ID: 3.1) in full."""

    async def body(orch: Orchestrator) -> None:
        await _refresh(orch)
        _show(orch, _lookup(orch, job_id), _console())

    _run(home, body)


def _show(orch: Orchestrator, job: Job, console: Console) -> None:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()

    def row(key: str, value: Any) -> None:
        grid.add_row(key, value if isinstance(value, Text) else Text(str(value)))

    row("job", Text(job.fqid, style="bold"))
    if job.parent is not None:
        row("master", job.parent.fqid)
    row("name", job.name)
    row("status", _status(job.status))
    settings = ", ".join(f"{k}={_short(v, 60)}" for k, v in job.backend.settings.items())
    row("backend", job.backend.name + (f" ({settings})" if settings else ""))
    app = job.application
    if app is not None:
        row("application", shlex.join([app.exe, *app.args]))
        if app.env:
            row("env", " ".join(f"{k}={v}" for k, v in app.env.items()))
    row("inputfiles", "\n".join(job.inputfiles) or "-")
    row("outputfiles", "\n".join(job.outputfiles) or "-")
    row("mode", job.mode)
    if job.splitter is not None:
        row("splitter", _short(job.splitter))
    if job.merger is not None:
        row("merger", _short(job.merger))
    row("backend_id", job.backend_id or "-")
    info = job.info
    row("submit_counter", info.submit_counter)
    stamps = sorted(info.timestamps.items(), key=lambda kv: kv[1])
    row("timestamps", "\n".join(f"{k:<11}{_iso(t)}" for k, t in stamps) or "-")
    if info.reason:
        row("reason", Text(info.reason, style="red"))
    for i, entry in enumerate(info.history):
        row("history" if i == 0 else "", ", ".join(f"{k}={_short(v, 80)}" for k, v in entry.items()))
    if info.retry_args:
        row("retry_args", " ".join(info.retry_args))
    row("outputdir", str(job.outputdir))
    counts = _counts(orch, job)
    master = job.parent is None and orch.engine.sm.is_master(job.fqid_tuple[0])
    if master:
        row("subjobs", Text(f"{sum(counts.values())}: ") + _counts_text(counts))
    console.print(grid)
    if master:
        _show_subjobs(orch, job, console)


def _show_subjobs(orch: Orchestrator, job: Job, console: Console) -> None:
    n = len(job.subjobs)
    first = list(range(min(n, SHOW_SUBJOBS)))
    orch.engine.materialize(job, first)  # one query for the page, not one per subjob
    table = Table(box=None, header_style="bold", title=None)
    for col in ("id", "status", "args", "submits", "backend_id", "reason"):
        table.add_column(col, no_wrap=col in ("id", "status", "submits"), overflow="fold")
    for i in first:
        sub = job.subjobs[i]
        args = " ".join(sub.application.args) if sub.application else ""
        table.add_row(sub.fqid, _status(sub.status), Text(_short(args, 60)), str(sub.info.submit_counter),
                      Text(sub.backend_id or "-"), Text(sub.info.reason or "", style="red"))
    console.print()
    console.print(table)
    if n > len(first):
        console.print(Text(f"... and {n - len(first)} more subjobs (orchestrator show {job.fqid}.N)", style="dim"))


@cli.command()
@job_id_argument
@click.option("--keep-going", is_flag=True, help="Go on past a subjob that cannot be killed.")
@home_option
def kill(job_id: str, keep_going: bool, home: Path | None) -> None:
    """Kill a job (every active subjob of a master) or one subjob."""

    async def body(orch: Orchestrator) -> None:
        job = _lookup(orch, job_id)
        await job.kill(keep_going=keep_going)
        await _settle(orch)
        click.echo(f"job {job.fqid}: {job.status.value}")

    _run(home, body)


@cli.command()
@job_id_argument
@click.option("--all", "all_", is_flag=True, help="On a master: killed subjobs too, not only the failed ones.")
@click.option("--keep-going", is_flag=True, help="Go on past a subjob that cannot be resubmitted.")
@click.option("--from-state", "from_state", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Start from this saved state (written by 'orchestrator checkpoint get -o').")
@home_option
def resubmit(job_id: str, all_: bool, keep_going: bool, from_state: Path | None, home: Path | None) -> None:
    """Resubmit a master's failed subjobs (--all: and killed ones), or one job or subjob."""
    state = from_state.read_text(encoding="utf-8") if from_state is not None else None

    async def body(orch: Orchestrator) -> None:
        job = _lookup(orch, job_id)
        if state is not None:
            await job.resubmit(keep_going=keep_going, from_state=state)
            click.echo(f"job {job.fqid}: resubmitted from state {from_state}; {job.status.value}")
            return
        what = ""
        if len(job.fqid_tuple) == 1 and orch.engine.sm.is_master(job.fqid_tuple[0]):
            counts = _counts(orch, job)
            n = sum(counts.get(s, 0) for s in (S.FAILED, S.NEW, *((S.KILLED,) if all_ else ())))
            if not n:
                hint = " (--all takes the killed ones too)" if counts.get(S.KILLED) and not all_ else ""
                click.echo(f"job {job.fqid}: no subjob to resubmit{hint}")
                return
            what = f" {n} subjob(s)"
        await job.resubmit(only_failed=not all_, keep_going=keep_going)
        click.echo(f"job {job.fqid}: resubmitted{what}; {job.status.value}")

    _run(home, body)


@cli.command()
@job_id_argument
@click.option("--arg", "args", multiple=True, help="A retry argument (ORCH_RETRY_ARG_n), in order; repeatable.")
@home_option
def release(job_id: str, args: tuple[str, ...], home: Path | None) -> None:
    """Resume a held job, or a master's held subjobs, optionally with new retry arguments."""

    async def body(orch: Orchestrator) -> None:
        job = _lookup(orch, job_id)
        await job.release(retry_args=list(args) if args else None)
        click.echo(f"job {job.fqid}: released; {job.status.value}")

    _run(home, body)


@cli.command()
@job_id_argument
@home_option
def remove(job_id: str, home: Path | None) -> None:
    """Forget a final or new top-level job and delete its workspace."""

    async def body(orch: Orchestrator) -> None:
        job = _lookup(orch, job_id)
        fqid = job.fqid
        await job.remove()
        click.echo(f"job {fqid}: removed")

    _run(home, body)


@cli.command()
@job_id_argument
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds (exit code 1).")
@home_option
def wait(job_id: str, timeout: float | None, home: Path | None) -> None:
    """Follow a job until nothing of it is active; exit 0 if it ended completed, else 1."""
    click.get_current_context().exit(_run(home, lambda orch: _follow(orch, _lookup(orch, job_id), timeout)))


async def _follow(orch: Orchestrator, job: Job, timeout: float | None) -> int:
    """Show the job's progress until ``job.wait()`` returns: live on a terminal, else one line at the end."""
    console = _console()

    def snapshot() -> tuple[int, int, dict[JobStatus, int]]:
        counts = _counts(orch, job)
        return sum(counts.get(s, 0) for s in FINAL), sum(counts.values()), counts

    async def until_done(render: Callable[[], None]) -> bool:
        with anyio.move_on_after(math.inf if timeout is None else timeout) as scope:
            while True:
                render()
                with anyio.move_on_after(POLL) as tick:
                    await job.wait()
                if not tick.cancelled_caught:
                    break
        render()
        return scope.cancelled_caught

    if console.is_terminal:
        columns = (TextColumn("job {task.fields[fqid]} {task.fields[status]}"), BarColumn(),
                   MofNCompleteColumn(), TextColumn("{task.fields[counts]}"), TimeElapsedColumn())
        with Progress(*columns, console=console, auto_refresh=False) as progress:
            task = progress.add_task("", total=1, fqid=job.fqid, status=_status(job.status).markup, counts="")

            def render() -> None:
                final, total, counts = snapshot()
                progress.update(task, completed=final, total=max(total, 1), status=_status(job.status).markup,
                                counts=_counts_text(counts).markup)
                progress.refresh()

            timed_out = await until_done(render)
    else:
        timed_out = await until_done(lambda: None)
    final, total, counts = snapshot()
    status = job.status
    line = Text(f"job {job.fqid} ")
    line.append(status.value, style=STYLES[status])
    line.append(f": {final}/{total} final")
    if counts:
        line.append(" (").append_text(_counts_text(counts)).append(")")
    if job.info.reason:
        line.append(f"; {job.info.reason}", style="red")
    console.print(line, soft_wrap=True)
    if timed_out:
        Console(stderr=True).print(Text(f"timed out after {timeout:g} s; job {job.fqid} goes on", style="yellow"),
                                   soft_wrap=True)
        return 1
    return 0 if status == S.COMPLETED else 1


@cli.command()
@click.option("-n", "--subjobs", default=12, show_default=True, type=click.IntRange(1, 10_000),
              help="Number of subjobs.")
@home_option
def demo(subjobs: int, home: Path | None) -> None:
    """Run a small job on this machine: N subjobs square their index; print the merged output."""

    async def body(orch: Orchestrator) -> int:
        path = orch.home / "demo" / "demo.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(demo_job_text(subjobs))
        job = await orch.jobs.add(load_job(path))
        console = _console()
        console.print(Text(f"demo: job {job.id}, {subjobs} subjobs on the local backend (job file {path})"),
                      soft_wrap=True)
        await job.submit(keep_going=True)
        code = await _follow(orch, job, None)
        merged = job.outputdir / "stdout"
        console.print(Text(f"merged output ({merged}):", style="bold"), soft_wrap=True)
        try:
            click.echo(merged.read_text(), nl=False)
        except FileNotFoundError:
            raise CliError(f"job {job.fqid}: no merged output at {merged} ({job.info.reason or job.status})") from None
        return code

    click.get_current_context().exit(_run(home, body))


def main() -> None:
    cli(prog_name="orchestrator")


def _add_plugin_commands() -> None:
    """Commands that plugins register under the entry-point group ``orchestrator.commands``."""
    manager: ExtensionManager[Any] = ExtensionManager(namespace="orchestrator.commands", invoke_on_load=False)
    for ext in manager:
        if isinstance(ext.plugin, click.Command) and ext.name not in cli.commands:
            cli.add_command(ext.plugin, ext.name)


_add_plugin_commands()


if __name__ == "__main__":
    main()
