"""The ``orchestrator`` commands: submit, jobs, show, peek, kill, resubmit, release, remove, wait, demo, serve,
backup.

Written once over the API (see :mod:`.app`): through a service when one
holds the home, on the home opened here otherwise; the output is the same.
``wait`` (and ``submit --wait``, ``demo``) exits 0 when the job ended
completed, 1 otherwise.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from ..api import usage, views
from ..api.job import Job
from ..api.orchestrator import Orchestrator
from ..core.statuses import ALL_STATUSES, FINAL, JobStatus
from ..plugin.logs import configure as configure_logs
from . import render
from .app import (
    CliError,
    Group,
    home_of,
    home_option,
    job_id_argument,
    nothing_to_do,
    remote_options,
    repository_of,
    repository_option,
    run,
)
from .jobfile import demo_job_text, load_job

S = JobStatus
#: Seconds between two refreshes of the live display.
POLL = 0.2


def _lookup(orch: Orchestrator, ident: str) -> Job:
    try:
        job: Job = orch.jobs(ident)
    except KeyError:
        raise CliError(f"no job {ident}") from None
    return job


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="orchestrator", prog_name="orchestrator")
@home_option
@repository_option
@click.option("-v", "--verbose", is_flag=True, help="Log the orchestrator's work (INFO) on stderr.")
@remote_options
def cli(home: Path | None, repository: str | None, verbose: bool, url: str | None, token_file: Path | None,
        ca: Path | None) -> None:
    """An asynchronous job orchestrator for batch and grid computing.

    \b
    Exit codes:
      0  done (for submit --wait and wait: every job ended completed)
      1  a job ended otherwise (failed, killed, held) or the wait timed out
      2  an error: bad input, an unknown job, a refused operation, a damaged
         repository file (the message says which and what to do)
      3  nothing to do: kill of a job that is over, resubmit with nothing
         to resubmit (said on stdout)
    """
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
        try:
            await added.submit(keep_going=keep_going)
        except BaseException:
            if added.status == S.NEW and not added.is_active():  # a job file that cannot run leaves nothing
                await added.remove()
            raise
        click.echo(added.fqid)
        return await _follow(added, timeout) if wait_ else 0

    click.get_current_context().exit(_watched(home, body))


STATUS_CHOICE = click.Choice([s.value for s in ALL_STATUSES])


def print_json(value: Any) -> None:
    """One JSON document on stdout (the schemas are in docs/reference.md)."""
    click.echo(json.dumps(value, indent=1, sort_keys=False))


@cli.command()
@click.option("--status", "statuses", multiple=True, type=STATUS_CHOICE, help="Only jobs in this status (repeatable).")
@click.option("--name", default=None, help="Only jobs whose name matches this glob.")
@click.option("--backend", default=None, help="Only jobs on this backend.")
@click.option("--owner", default=None, help="Only the jobs of this user (an admin sees every user's).")
@click.option("--limit", type=click.IntRange(1), default=None, help="Only the N most recent of the matching jobs.")
@click.option("--json", "as_json", is_flag=True, help="A JSON document instead of the table (docs/reference.md).")
@home_option
def jobs(statuses: tuple[str, ...], name: str | None, backend: str | None, owner: str | None, limit: int | None,
         as_json: bool, home: Path | None) -> None:
    """List the top-level jobs: id, name, owner, status, backend, subjob counts per status, submitted, elapsed.

    Through a shared service, a user's own jobs; an admin's, everyone's."""

    async def body(orch: Orchestrator) -> None:
        chosen = list(orch.jobs.select(status=list(statuses) or None, name=name, backend=backend, owner=owner))
        selected = views.summaries(chosen[-limit:] if limit else chosen)
        if as_json:
            print_json({"schema": 1, "jobs": selected, "totals": render.totals_of(selected)})
            return
        console = render.console()
        if not selected:
            console.print("no jobs")
            return
        console.print(render.jobs_table(selected, console.width), soft_wrap=True)

    run(home, body, refresh=True, read_only=True)


#: ``show`` reads the runs' CPU records (one small file each) up to this many subjobs; ``report`` always does.
SHOW_CPU_RUNS = 20_000


@cli.command()
@job_id_argument
@click.option("--status", "statuses", multiple=True, type=STATUS_CHOICE,
              help="On a master: list every subjob in this status (repeatable).")
@click.option("--all", "all_", is_flag=True, help="On a master: list every subjob (not only the first 50).")
@click.option("--offset", type=click.IntRange(0), default=0, help="With --status or --all: skip the first K listed.")
@click.option("--limit", type=click.IntRange(1), default=None, help="With --status or --all: list at most N.")
@click.option("--json", "as_json", is_flag=True, help="A JSON document instead of the text (docs/reference.md).")
@home_option
def show(job_id: str, statuses: tuple[str, ...], all_: bool, offset: int, limit: int | None, as_json: bool,
         home: Path | None) -> None:
    """Show a job (ID: 3) or a subjob (ID: 3.1) in full; on a master, its subjobs (the first 50, or those asked)."""

    async def body(orch: Orchestrator) -> None:
        job = _lookup(orch, job_id)
        listing = bool(statuses) or all_
        record = views.detail(job, subjobs=0 if listing else views.SHOW_SUBJOBS)
        if listing:
            record["subjob_rows"] = views.subjob_rows(job, statuses, offset, limit)
        record["cpu"] = usage.report(job) if record["subjobs"] <= SHOW_CPU_RUNS else None
        if as_json:
            print_json({"schema": 1, **record})
            return
        console = render.console()
        if listing and console.is_terminal and len(record["subjob_rows"]) > console.height:
            with console.pager(styles=True):
                render.show(record, console, listed=True)
        else:
            render.show(record, console, listed=listing)

    run(home, body, refresh=True, read_only=True)


@cli.command()
@job_id_argument
@click.argument("name", default="stdout")
@click.option("--tail", type=click.IntRange(1), default=None, help="Only the last N lines.")
@click.option("--json", "as_json", is_flag=True, help='{"fqid", "name", "text"} instead of the text.')
@home_option
def peek(job_id: str, name: str, tail: int | None, as_json: bool, home: Path | None) -> None:
    """Print a file of a run (NAME: stdout, stderr, orch.log or an output file): from its output dir once it
    ended, from its work dir while it runs."""

    async def body(orch: Orchestrator) -> None:
        text = await _lookup(orch, job_id).peek(name, tail=tail)
        if as_json:
            print_json({"schema": 1, "fqid": job_id, "name": name, "text": text})
        elif sys.stdout.isatty():  # on a terminal, the file's control characters escaped
            click.echo(render.safe(text, keep="\n\t"), nl=not text.endswith("\n") and bool(text))
        else:  # a pipe or a file gets the text as the run wrote it
            click.echo(text, nl=not text.endswith("\n") and bool(text), color=True)

    run(home, body, refresh=True, read_only=True)


@cli.command()
@job_id_argument
@click.option("--keep-going", is_flag=True, help="Go on past a subjob that cannot be killed.")
@home_option
def kill(job_id: str, keep_going: bool, home: Path | None) -> None:
    """Kill a job (every active subjob of a master) or one subjob; exit 3 when nothing was left to kill."""

    async def body(orch: Orchestrator) -> None:
        job = _lookup(orch, job_id)
        done = await job.kill(keep_going=keep_going)
        if not done.acted:
            nothing_to_do(f"job {job.fqid}: nothing to kill ({job.status.value})")
        click.echo(f"job {job.fqid}: {job.status.value}")

    run(home, body)


@cli.command()
@job_id_argument
@click.option("--all", "all_", is_flag=True, help="On a master: killed subjobs too, not only the failed ones.")
@click.option("--keep-going", is_flag=True, help="Go on past a subjob that cannot be resubmitted.")
@click.option("--from-state", "from_state", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Start from this saved state (written by 'orchestrator checkpoint get -o').")
@home_option
def resubmit(job_id: str, all_: bool, keep_going: bool, from_state: Path | None, home: Path | None) -> None:
    """Resubmit a master's failed subjobs (--all: and killed ones), or one job or subjob; exit 3 when there
    was nothing to resubmit."""
    state = from_state.read_text(encoding="utf-8") if from_state is not None else None

    async def body(orch: Orchestrator) -> None:
        job = _lookup(orch, job_id)
        if state is not None:
            await job.resubmit(keep_going=keep_going, from_state=state)
            click.echo(f"job {job.fqid}: resubmitted from state {from_state}; {job.status.value}")
            return
        done = await job.resubmit(only_failed=not all_, keep_going=keep_going)
        if not done.acted:
            killed = job.parent is None and views.counts(job).get("killed")
            hint = " (--all takes the killed ones too)" if killed and not all_ else ""
            nothing_to_do(f"job {job.fqid}: no subjob to resubmit{hint}")
        what = f" {done.acted} subjob(s)" if views.counts(job) else ""
        click.echo(f"job {job.fqid}: resubmitted{what}; {job.status.value}")

    run(home, body)


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

    run(home, body)


@cli.command()
@job_id_argument
@home_option
def remove(job_id: str, home: Path | None) -> None:
    """Forget a final or new top-level job and delete its workspace."""

    async def body(orch: Orchestrator) -> None:
        job = _lookup(orch, job_id)
        await job.remove()
        click.echo(f"job {job_id}: removed")

    run(home, body)


@cli.command()
@job_id_argument
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds (exit code 1).")
@home_option
def wait(job_id: str, timeout: float | None, home: Path | None) -> None:
    """Follow a job until nothing of it is active; exit 0 if it ended completed, else 1."""
    click.get_current_context().exit(_watched(home, lambda orch: _follow(_lookup(orch, job_id), timeout)))


#: The jobs a command is following (``wait``, ``submit --wait``), for the message that Ctrl-C gets.
_FOLLOWED: list[str] = []
#: The exit code of a command stopped by Ctrl-C (128 + SIGINT), as a shell reports it.
INTERRUPTED = 130


def _watched(home: Path | None, body: Callable[[Orchestrator], Any]) -> int:
    """``run`` for a command that follows a job: Ctrl-C stops the watching, never the job, and says so."""
    try:
        return int(run(home, body))
    except KeyboardInterrupt:
        if not _FOLLOWED:
            raise
        fqid = _FOLLOWED[-1]
        Console(stderr=True).print(Text(f"stopped watching; job {fqid} goes on (watch it again with "
                                        f"'orchestrator wait {fqid}')", style="yellow"), soft_wrap=True)
        return INTERRUPTED


async def _follow(job: Job, timeout: float | None) -> int:
    """Show the job's progress until it is no longer active: live on a terminal, else one line at the end."""
    console = render.console()

    async def until_done(render_now: Callable[[], None]) -> bool:
        with anyio.move_on_after(math.inf if timeout is None else timeout) as scope:
            while True:
                render_now()
                try:
                    await job.wait(timeout=POLL)
                    break
                except TimeoutError:
                    continue
        render_now()
        return scope.cancelled_caught

    _FOLLOWED.append(job.fqid)
    if console.is_terminal:
        columns = (TextColumn("job {task.fields[fqid]} {task.fields[status]}"), BarColumn(),
                   MofNCompleteColumn(), TextColumn("{task.fields[counts]}"), TimeElapsedColumn())
        with Progress(*columns, console=console, auto_refresh=False) as bar:
            task = bar.add_task("", total=1, fqid=job.fqid, status="", counts="")

            def render_now() -> None:
                record = views.summary(job)
                final, total = views.final_or_total(record)
                bar.update(task, completed=final, total=max(total, 1),
                           counts=render.counts_text(record["counts"]).markup,
                           status=render.status_text(record["status"]).markup)
                bar.refresh()

            timed_out = await until_done(render_now)
    else:
        timed_out = await until_done(lambda: None)
    record = views.summary(job)
    final, total = views.final_or_total(record)
    line = Text(f"job {record['fqid']} ")
    line.append(record["status"], style=render.STYLES[JobStatus(record["status"])])
    line.append(f": {final}/{total} final")
    if record["counts"]:
        line.append(" (").append_text(render.counts_text(record["counts"])).append(")")
    if record["reason"]:
        line.append(f"; {render.safe(record['reason'])}", style="red")
    console.print(line, soft_wrap=True)
    if timed_out:
        Console(stderr=True).print(Text(f"timed out after {timeout:g} s; job {job.fqid} goes on", style="yellow"),
                                   soft_wrap=True)
        return 1
    return 0 if record["status"] == S.COMPLETED else 1


@cli.command()
@click.option("-n", "--subjobs", default=12, show_default=True, type=click.IntRange(1, 10_000),
              help="Number of subjobs.")
@home_option
def demo(subjobs: int, home: Path | None) -> None:
    """Run a small job on this machine: N subjobs square their index; print the merged output."""
    path = home_of(home)
    jobfile = path / "demo" / "demo.toml"
    jobfile.parent.mkdir(parents=True, exist_ok=True)
    jobfile.write_text(demo_job_text(subjobs))
    job = load_job(jobfile)

    async def body(orch: Orchestrator) -> int:
        added = await orch.jobs.add(job)
        console = render.console()
        console.print(Text(f"demo: job {added.fqid}, {subjobs} subjobs on the local backend (job file {jobfile})"),
                      soft_wrap=True)
        await added.submit(keep_going=True)
        code = await _follow(added, None)
        merged = added.outputdir / "stdout"
        console.print(Text(f"merged output ({merged}):", style="bold"), soft_wrap=True)
        try:
            click.echo(merged.read_text(), nl=False)
        except FileNotFoundError:
            raise CliError(f"job {added.fqid}: no merged output at {merged} "
                           f"({added.info.reason or added.status.value})") from None
        return code

    click.get_current_context().exit(run(home, body))


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Replace the backup already in PATH.")
@home_option
def backup(path: Path, force: bool, home: Path | None) -> None:
    """Copy the home's databases into the directory PATH, safely while a service or anyone writes the home.

    \b
    PATH gets repository.sqlite (and workflows.sqlite, when the home has one),
    copied with SQLite's online backup API and checked with PRAGMA quick_check.
    An existing backup in PATH is refused without --force. To restore, stop
    what uses the home and copy the files back into it; `--home PATH` opens the
    backup itself. Job directories and outputs are not copied. A home whose
    repository is PostgreSQL is refused: back its database up with pg_dump.
    """
    from ..runtime.backup import backup as backup_home
    from ..runtime.config import Config
    from ..runtime.storage import Storage

    where = home_of(home)
    storage = Storage.of(where, {**Config.load(where).section("repository"),
                                 **({"url": url} if (url := repository_of()) else {})})
    if storage.shared:
        raise CliError(f"orchestrator backup copies a home's SQLite files; this home's repository is "
                       f"{storage.where}: back it up with PostgreSQL's own tools (pg_dump), and the shared "
                       f"directory {storage.data_dir} with the workspaces as any directory")
    for copied in backup_home(where, path, force=force):
        jobs = f"{copied.jobs} job{'s' if copied.jobs != 1 else ''}, " if copied.jobs is not None else ""
        click.echo(f"{copied.source} -> {copied.target}: {jobs}{_size(copied.size)}, quick_check ok")


def _size(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n < 1024 ** 2 else f"{n / 1024 ** 2:.1f} MiB"


__all__ = ["FINAL", "cli"]
