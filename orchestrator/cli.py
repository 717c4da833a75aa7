"""The ``orchestrator`` command: submit, list, show, kill, resubmit, remove and wait for jobs; serve a home.

When a service (``orchestrator serve``) holds the home, each command is a
request to it over its Unix socket; otherwise the command opens the home
itself for as long as it runs, and closes it (runs already at a backend
carry on in between). Both ways go through the same control interface
(:mod:`orchestrator.control`), so the output is the same. Refused
operations, bad job files, a busy home and unknown ids end with a one-line
message on stderr and exit code 2. ``wait`` (and ``submit --wait``, ``demo``)
exits 0 when the job ended completed, 1 otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text
from stevedore import ExtensionManager

from . import cli_render as render
from .control import Control
from .errors import OrchestratorError
from .ids import fqid_str, parse_fqid
from .job import Job
from .jobfile import demo_job_text, load_job
from ..plugin.logs import configure as configure_logs
from .orchestrator import Orchestrator, default_home
from .status import ALL_STATUSES, JobStatus

T = TypeVar("T")
S = JobStatus
#: Seconds between two refreshes of the live display.
POLL = 0.2


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


_console = render.console
_short = render.short


def _home(home: Path | None) -> Path:
    if home is None:
        home = click.get_current_context().find_root().params.get("home")
    return Path(home).expanduser().resolve() if home is not None else default_home()


def _run(home: Path | None, body: Callable[[Orchestrator], Awaitable[T]]) -> T:
    """Open the home embedded, run ``body``, close the home (commands that need the objects themselves)."""
    path = _home(home)

    async def main() -> T:
        orch = Orchestrator(home=path, service=False)  # these need the objects themselves: refused under a service
        async with orch:
            return await body(orch)

    return anyio.run(main)


def _control(home: Path | None, body: Callable[[Any, Path], Awaitable[T]]) -> T:
    """Run ``body(control, home)`` through the home's service if one holds it, else on the home opened here."""
    from .service.client import connect

    path = _home(home)

    async def main() -> T:
        client = await connect(path)
        if client is not None:
            async with client:
                return await body(client, path)
        orch = Orchestrator(home=path, service=False)  # no service answered: open the home here
        async with orch:
            return await body(Control(orch), path)

    return anyio.run(main)


def _lookup(orch: Orchestrator, ident: str) -> Job:
    try:
        return orch.jobs(ident)
    except KeyError:
        raise CliError(f"no job {ident}") from None


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

    async def body(ctl: Any, _home: Path) -> int:
        added = await ctl.add(name=job.name, spec=job.spec())
        click.echo(added["fqid"])  # before submit(): if that fails, the job still exists, and the error names it
        await ctl.submit(fqid=added["fqid"], keep_going=keep_going)
        return await _follow(ctl, added["fqid"], timeout) if wait_ else 0

    click.get_current_context().exit(_control(home, body))


@cli.command()
@click.option("--status", "statuses", multiple=True, type=click.Choice([s.value for s in ALL_STATUSES]),
              help="Only jobs in this status (repeatable).")
@click.option("--name", default=None, help="Only jobs whose name matches this glob.")
@home_option
def jobs(statuses: tuple[str, ...], name: str | None, home: Path | None) -> None:
    """List the top-level jobs with their subjob counts per status."""

    async def body(ctl: Any, _home: Path) -> None:
        selected = await ctl.jobs(status=list(statuses) or None, name=name)
        console = _console()
        if not selected:
            console.print("no jobs")
            return
        console.print(render.jobs_table(selected))

    _control(home, body)


@cli.command()
@job_id_argument
@home_option
def show(job_id: str, home: Path | None) -> None:
    """Show a job (ID: 3) or a subjob (ID: 3.1) in full."""

    async def body(ctl: Any, _home: Path) -> None:
        render.show(await ctl.show(fqid=job_id), _console())

    _control(home, body)


@cli.command()
@job_id_argument
@click.option("--keep-going", is_flag=True, help="Go on past a subjob that cannot be killed.")
@home_option
def kill(job_id: str, keep_going: bool, home: Path | None) -> None:
    """Kill a job (every active subjob of a master) or one subjob."""

    async def body(ctl: Any, _home: Path) -> None:
        job = await ctl.kill(fqid=job_id, keep_going=keep_going)
        click.echo(f"job {job['fqid']}: {job['status']}")

    _control(home, body)


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

    async def body(ctl: Any, _home: Path) -> None:
        if state is not None:
            job = await ctl.resubmit(fqid=job_id, keep_going=keep_going, from_state=state)
            click.echo(f"job {job['fqid']}: resubmitted from state {from_state}; {job['status']}")
            return
        what = ""
        counts = (await ctl.show(fqid=job_id, subjobs=0))["counts"]
        if counts:
            n = sum(counts.get(s.value, 0) for s in (S.FAILED, S.NEW, *((S.KILLED,) if all_ else ())))
            if not n:
                hint = " (--all takes the killed ones too)" if counts.get("killed") and not all_ else ""
                click.echo(f"job {job_id}: no subjob to resubmit{hint}")
                return
            what = f" {n} subjob(s)"
        job = await ctl.resubmit(fqid=job_id, only_failed=not all_, keep_going=keep_going)
        click.echo(f"job {job['fqid']}: resubmitted{what}; {job['status']}")

    _control(home, body)


@cli.command()
@job_id_argument
@click.option("--arg", "args", multiple=True, help="A retry argument (ORCH_RETRY_ARG_n), in order; repeatable.")
@home_option
def release(job_id: str, args: tuple[str, ...], home: Path | None) -> None:
    """Resume a held job, or a master's held subjobs, optionally with new retry arguments."""

    async def body(ctl: Any, _home: Path) -> None:
        job = await ctl.release(fqid=job_id, retry_args=list(args) if args else None)
        click.echo(f"job {job['fqid']}: released; {job['status']}")

    _control(home, body)


@cli.command()
@job_id_argument
@home_option
def remove(job_id: str, home: Path | None) -> None:
    """Forget a final or new top-level job and delete its workspace."""

    async def body(ctl: Any, _home: Path) -> None:
        gone = await ctl.remove(fqid=job_id)
        click.echo(f"job {gone['fqid']}: removed")

    _control(home, body)


@cli.command()
@job_id_argument
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds (exit code 1).")
@home_option
def wait(job_id: str, timeout: float | None, home: Path | None) -> None:
    """Follow a job until nothing of it is active; exit 0 if it ended completed, else 1."""
    click.get_current_context().exit(_control(home, lambda ctl, _home: _follow(ctl, job_id, timeout)))


async def _follow(ctl: Any, fqid: str, timeout: float | None) -> int:
    """Show the job's progress until it is no longer active: live on a terminal, else one line at the end."""
    console = _console()
    job: dict[str, Any] = await ctl.wait(fqid=fqid, timeout=0)

    async def until_done(render_now: Callable[[], None]) -> bool:
        nonlocal job
        with anyio.move_on_after(math.inf if timeout is None else timeout) as scope:
            while job["timed_out"]:
                render_now()
                job = await ctl.wait(fqid=fqid, timeout=POLL)
        render_now()
        return scope.cancelled_caught

    if console.is_terminal:
        columns = (TextColumn("job {task.fields[fqid]} {task.fields[status]}"), BarColumn(),
                   MofNCompleteColumn(), TextColumn("{task.fields[counts]}"), TimeElapsedColumn())
        with Progress(*columns, console=console, auto_refresh=False) as bar:
            task = bar.add_task("", total=1, fqid=fqid, status=render.status_text(job["status"]).markup, counts="")

            def render_now() -> None:
                final, total = render.progress(job)
                bar.update(task, completed=final, total=max(total, 1), counts=render.counts_text(job["counts"]).markup,
                           status=render.status_text(job["status"]).markup)
                bar.refresh()

            timed_out = await until_done(render_now)
    else:
        timed_out = await until_done(lambda: None)
    final, total = render.progress(job)
    line = Text(f"job {job['fqid']} ")
    line.append(job["status"], style=render.STYLES[JobStatus(job["status"])])
    line.append(f": {final}/{total} final")
    if job["counts"]:
        line.append(" (").append_text(render.counts_text(job["counts"])).append(")")
    if job["reason"]:
        line.append(f"; {job['reason']}", style="red")
    console.print(line, soft_wrap=True)
    if timed_out:
        Console(stderr=True).print(Text(f"timed out after {timeout:g} s; job {fqid} goes on", style="yellow"),
                                   soft_wrap=True)
        return 1
    return 0 if job["status"] == S.COMPLETED else 1


@cli.command()
@click.option("-n", "--subjobs", default=12, show_default=True, type=click.IntRange(1, 10_000),
              help="Number of subjobs.")
@home_option
def demo(subjobs: int, home: Path | None) -> None:
    """Run a small job on this machine: N subjobs square their index; print the merged output."""

    async def body(ctl: Any, path: Path) -> int:
        jobfile = path / "demo" / "demo.toml"
        jobfile.parent.mkdir(parents=True, exist_ok=True)
        jobfile.write_text(demo_job_text(subjobs))
        job = load_job(jobfile)
        added = await ctl.add(name=job.name, spec=job.spec())
        console = _console()
        console.print(Text(f"demo: job {added['fqid']}, {subjobs} subjobs on the local backend (job file {jobfile})"),
                      soft_wrap=True)
        await ctl.submit(fqid=added["fqid"], keep_going=True)
        code = await _follow(ctl, added["fqid"], None)
        detail = await ctl.show(fqid=added["fqid"], subjobs=0)
        merged = Path(detail["outputdir"]) / "stdout"
        console.print(Text(f"merged output ({merged}):", style="bold"), soft_wrap=True)
        try:
            click.echo(merged.read_text(), nl=False)
        except FileNotFoundError:
            raise CliError(f"job {added['fqid']}: no merged output at {merged} "
                           f"({detail['reason'] or detail['status']})") from None
        return code

    click.get_current_context().exit(_control(home, body))


@cli.command()
@click.option("--tcp-port", type=int, default=None,
              help="Also listen on 127.0.0.1:PORT (0: any free port), bearer token required. Default: [service].")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The bearer token for TCP clients (created, mode 0600, if missing). "
                   "Default: [service] token_file, else <home>/service/token.")
@home_option
def serve(tcp_port: int | None, token_file: Path | None, home: Path | None) -> None:
    """Run the service on a home until SIGTERM: monitoring, control API on a Unix socket, status page."""
    from .service.daemon import run_service

    path = _home(home)
    click.get_current_context().exit(anyio.run(lambda: run_service(path, tcp_port=tcp_port, token_file=token_file)))


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
