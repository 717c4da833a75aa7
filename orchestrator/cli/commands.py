"""The ``orchestrator`` commands: submit, jobs, show, peek, kill, resubmit, release, remove, wait, demo, serve,
backup.

Written once over the API (see :mod:`.app`): through a service when one
holds the home, on the home opened here otherwise; the output is the same.
``wait`` (and ``submit --wait``, ``demo``) exits 0 when the job ended
completed, 1 otherwise.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import pwd
import sys
from collections.abc import Callable, Sequence
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
from ..core.ids import parse_id_range
from ..core.statuses import ALL_STATUSES, FINAL, JobStatus
from ..plugin.logs import configure as configure_logs
from ..runtime.registry import backend_names
from . import columns, render, showing
from .app import (
    CliError,
    Group,
    home_of,
    home_option,
    job_id_argument,
    remote_options,
    repository_of,
    repository_option,
    run,
)
from .columns import FIELDS
from .jobfile import demo_job_text, load_job
from .targets import Named, job_ids_argument, lookup, resolve

#: Seconds between two refreshes of the live display.
POLL = 0.2


_lookup = lookup


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
    # A terminal is for the user's answers: the orchestrator's own warnings (a backend retried, a run found late)
    # are the service's log's business, shown here with -v only.
    configure_logs(level="INFO" if verbose else "ERROR")


@cli.command()
@click.argument("jobfile", type=click.Path(path_type=Path))
@click.option("--keep-going/--no-keep-going", default=False, show_default=True,
              help="Submit every subjob even when some fail to submit.")
@click.option("--wait", "wait_", is_flag=True, help="Then follow the job until it ends (as 'wait').")
@click.option("--timeout", type=float, default=None, help="With --wait: give up after this many seconds.")
@click.option("-q", "--quiet", "--parsable", "quiet", is_flag=True,
              help="Print the id only (with --wait: no progress; the exit code says how the job ended).")
@home_option
def submit(jobfile: Path, keep_going: bool, wait_: bool, timeout: float | None, quiet: bool,
           home: Path | None) -> None:
    """Add the job described by JOBFILE (TOML) and submit it; print its id."""
    job = load_job(jobfile)  # before the home is opened: a bad file leaves nothing behind

    async def body(orch: Orchestrator) -> int:
        added = await orch.jobs.add(job)
        try:
            await added.submit(keep_going=keep_going)
        except BaseException:
            if added.status == JobStatus.NEW and not added.is_active():  # a job file that cannot run leaves nothing
                await added.remove()
            raise
        click.echo(added.fqid)
        if wait_ and quiet:
            return await _ended(added, timeout)
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
@click.option("--format", "format_", metavar="FIELD,...", default=None,
              help="The columns, as sacct's --format: " + ",".join(FIELDS) + " (docs/reference.md, Columns).")
@click.option("--json", "as_json", is_flag=True, help="A JSON document instead of the table (docs/reference.md).")
@home_option
def jobs(statuses: tuple[str, ...], name: str | None, backend: str | None, owner: str | None, limit: int | None,
         format_: str | None, as_json: bool, home: Path | None) -> None:
    """List the top-level jobs: id, name, owner, status, backend, subjob counts per status, submitted, elapsed.

    Through a shared service, a user's own jobs; an admin's, everyone's."""

    async def body(orch: Orchestrator) -> None:
        _known_value(backend, "backend", lambda: {*backend_names(), *(j.backend.name for j in orch.jobs)})
        _known_value(owner, "owner", lambda: {j.owner for j in orch.jobs if j.owner} | _os_users(owner))
        chosen = list(orch.jobs.select(status=list(statuses) or None, name=name, backend=backend, owner=owner))
        selected = views.summaries(chosen[-limit:] if limit else chosen)
        if as_json:
            print_json({"schema": 1, "jobs": selected, "totals": render.totals_of(selected)})
            return
        console = render.console()
        if not selected:
            console.print("no jobs")
            return
        fields = _fields(format_, columns.JOBS)
        totals = render.totals_of(selected) if len(selected) > 1 else None
        console.print(columns.table(selected, fields, console.width, totals), soft_wrap=True)

    run(home, body, refresh=True, read_only=True)


def _known_value(value: str | None, what: str, known: Callable[[], set[str]]) -> None:
    """A filter's value that nothing could match (a typo: ``--backend lcoal``) is an error with a suggestion."""
    if value is None:
        return
    names = known()
    if value in names:
        return
    close = difflib.get_close_matches(value, sorted(names), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise CliError(f"no {what} {value!r}{hint}; known: {', '.join(sorted(names)) or 'none'}")


def _os_users(name: str | None) -> set[str]:
    """``{name}`` when it is an account of this machine (whose jobs may simply be none yet)."""
    try:
        return {pwd.getpwnam(name).pw_name} if name else set()
    except KeyError:
        return set()


#: ``show`` reads the runs' CPU records (one small file each) up to this many subjobs; ``report`` always does.
SHOW_CPU_RUNS = 20_000


@cli.command()
@job_ids_argument
@click.option("--status", "statuses", multiple=True, type=STATUS_CHOICE,
              help="On a master: list every subjob in this status (repeatable).")
@click.option("--all", "all_", is_flag=True, help="On a master: list every subjob (not only the first 50).")
@click.option("--offset", type=click.IntRange(0), default=0, help="With --status or --all: skip the first K listed.")
@click.option("--limit", type=click.IntRange(1), default=None, help="With --status or --all: list at most N.")
@click.option("--format", "format_", metavar="FIELD,...", default=None,
              help="A master's subjobs' columns, as sacct's --format (docs/reference.md, Columns).")
@click.option("--json", "as_json", is_flag=True, help="A JSON document instead of the text (docs/reference.md).")
@home_option
def show(job_ids: Sequence[Named], statuses: tuple[str, ...], all_: bool, offset: int, limit: int | None,
         format_: str | None, as_json: bool, home: Path | None) -> None:
    """Show jobs (ID...: 3, 3 4 5) or subjobs (3.1, 3.[0-9], 3.0-99) in full; on a master, its subjobs (the first
    50, or those asked). Several: one after another (--json: {"schema", "shown": [...]})."""

    fields = _fields(format_, columns.SUBJOBS)

    async def body(orch: Orchestrator) -> None:
        jobs = [job for target in resolve(orch, job_ids) for job in target.jobs()]
        listing = bool(statuses) or all_
        records = []
        for job in jobs:
            record = views.detail(job, subjobs=0 if listing else views.SHOW_SUBJOBS)
            if listing:
                record["subjob_rows"] = views.subjob_rows(job, statuses, offset, limit)
            record["cpu"] = usage.report(job) if record["subjobs"] <= SHOW_CPU_RUNS else None
            records.append(record)
        if as_json:
            print_json({"schema": 1, **records[0]} if len(records) == 1 else {"schema": 1, "shown": records})
            return
        console = render.console()
        lines = sum(len(r.get("subjob_rows", ())) + 20 for r in records)
        if console.is_terminal and (len(records) > 1 or listing) and lines > console.height:
            os.environ.setdefault("LESS", "FRX")  # colours as colours (git's default), not raw ESC[1m
            with console.pager(styles=True):
                _show_all(records, console, listing, fields)
        else:
            _show_all(records, console, listing, fields)

    run(home, body, refresh=True, read_only=True)


def _show_all(records: list[dict[str, Any]], console: Console, listing: bool, fields: list[str]) -> None:
    for k, record in enumerate(records):
        if k:
            console.print()
        showing.show(record, console, listed=listing, fields=fields)


def _fields(format_: str | None, default: Sequence[str]) -> list[str]:
    try:
        return columns.parse_format(format_, default)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--format'") from None


@cli.command()
@click.argument("ids_and_name", metavar="ID... [NAME]", nargs=-1, required=True)
@click.option("--tail", type=click.IntRange(1), default=None, help="Only the last N lines.")
@click.option("--json", "as_json", is_flag=True, help='{"fqid", "name", "text"} instead of the text.')
@home_option
def peek(ids_and_name: tuple[str, ...], tail: int | None, as_json: bool, home: Path | None) -> None:
    """Print a file of runs (ID...: 3.1, 3.1 3.4, 3.[0-9]; NAME: stdout (default), stderr, orch.log or an output
    file): from the output dir once a run ended, from its work dir while it runs. Several runs: each under a
    '==> ID NAME <==' line, as tail does (--json: {"schema", "peeks": [...]})."""
    args = list(ids_and_name)
    name = "stdout"
    if len(args) > 1:
        try:
            parse_id_range(args[-1])
        except ValueError:
            name = args.pop()
    named = _parse_ids(args)

    async def body(orch: Orchestrator) -> None:
        jobs = [job for target in resolve(orch, named) for job in target.jobs()]
        texts = [(job.fqid, await job.peek(name, tail=tail)) for job in jobs]
        if as_json:
            peeks = [{"fqid": fqid, "name": name, "text": text} for fqid, text in texts]
            print_json({"schema": 1, **peeks[0]} if len(peeks) == 1 else {"schema": 1, "peeks": peeks})
            return
        terminal = sys.stdout.isatty()
        for k, (fqid, text) in enumerate(texts):
            if len(texts) > 1:
                click.echo(f"{chr(10) if k else ''}==> {fqid} {render.safe(name)} <==")
            if terminal:  # on a terminal, the file's control characters escaped
                click.echo(render.safe(text, keep="\n\t"), nl=not text.endswith("\n") and bool(text))
            else:  # a pipe or a file gets the text as the run wrote it
                click.echo(text, nl=not text.endswith("\n") and bool(text), color=True)

    run(home, body, refresh=True, read_only=True)


def _parse_ids(values: Sequence[str]) -> list[Named]:
    named: list[Named] = []
    for value in values:
        try:
            named.extend(parse_id_range(value))
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    return named


@cli.command()
@job_id_argument
@click.option("--timeout", type=float, default=None, help="Give up after this many seconds (exit code 1).")
@home_option
def wait(job_id: str, timeout: float | None, home: Path | None) -> None:
    """Follow a job until nothing of it is active; exit 0 if it ended completed, else 1."""
    click.get_current_context().exit(_watched(home, lambda orch: _follow(_lookup(orch, job_id), timeout)))


async def _ended(job: Job, timeout: float | None) -> int:
    """``_follow`` without a word: 0 once the job ended completed, 1 otherwise or on time-out."""
    _FOLLOWED.append(job.fqid)
    try:
        await job.wait(timeout=timeout)
    except TimeoutError:
        return 1
    return 0 if job.status == JobStatus.COMPLETED else 1


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
    return 0 if record["status"] == JobStatus.COMPLETED else 1


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
