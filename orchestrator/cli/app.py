"""The ``orchestrator`` command's plumbing: the group, its errors, opening the home once per command.

Every command opens ``Orchestrator(home)``, which goes through the service
when one holds the home and opens the home here otherwise, so a command is
written once and prints the same either way.

Exit codes: 0 done; 1 a job ended otherwise than completed (``wait``), or
it timed out; 2 a refusal, a bad job file, a busy home, an unknown id (a
one-line message on stderr); 3 nothing to do (``kill`` of a final job,
``resubmit`` with nothing to resubmit: the message says so).
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import click
from rich.console import Console
from rich.text import Text

from ..api.orchestrator import Orchestrator, default_home
from ..api.wire import RefreshRequest
from ..core.errors import HomeLockedError, OrchestratorError, RepositoryHeldError
from ..core.ids import fqid_str, parse_fqid
from ..runtime.homelock import READER_ROLE
from ..runtime.sqlite import on_read_only_media

T = TypeVar("T")
#: Exit code of a command that found nothing to do.
NOTHING_TO_DO = 3


class CliError(click.ClickException):
    """A one-line red message on stderr, exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        from .render import safe  # a message may quote a job's name, a field's value: never raw on a terminal

        Console(stderr=True).print(Text(f"error: {safe(self.message)}", style="red"), soft_wrap=True,
                                   highlight=False)


#: The entry-point group of the commands plugins add (``orchestrator wms``, ``orchestrator workflow``...).
PLUGIN_COMMANDS = "orchestrator.commands"


class Group(click.Group):
    """Turns the errors a user can cause (and fix) into ``CliError``; anything else is a bug: traceback.

    Plugins' commands are listed from their entry points and imported only when one is run (or asked
    for help), so ``orchestrator jobs`` does not load the workflow engine or a WMS client.
    """

    def _plugin_points(self) -> dict[str, importlib.metadata.EntryPoint]:
        points: dict[str, importlib.metadata.EntryPoint] = {}
        for ep in importlib.metadata.entry_points(group=PLUGIN_COMMANDS):
            points.setdefault(ep.name, ep)  # the first of a name wins, as for every plugin group
        return points

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._plugin_points()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        ep = self._plugin_points().get(cmd_name)
        if ep is None:
            return None
        try:
            loaded = ep.load()
        except Exception as exc:  # a broken plugin must not stop the others
            Console(stderr=True).print(Text(f"warning: plugin command {cmd_name!r} ({ep.value}) failed to load: "
                                            f"{type(exc).__name__}: {exc}", style="yellow"), highlight=False)
            return None
        if not isinstance(loaded, click.Command):
            return None
        self.add_command(loaded, cmd_name)
        return loaded

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
    # readable=False: the users of a team's home need only execute (x) on it, never to list it
    return click.option("--home", type=click.Path(file_okay=False, readable=False, path_type=Path), default=None,
                        help="Orchestrator home (default: $ORCHESTRATOR_HOME or ~/.orchestrator).")(f)


def repository_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--repository", metavar="URL", default=None,
                        help="A PostgreSQL repository (postgresql://...) instead of the home's [repository] url.")(f)


def remote_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--url``, ``--token-file`` and ``--ca``: a service reached over TCP (a client on another host)."""
    f = click.option("--ca", type=click.Path(dir_okay=False, path_type=Path), default=None, envvar="ORCHESTRATOR_CA",
                     help="With --url https://...: the PEM file of the CA that signed the service's certificate "
                          "(default: $ORCHESTRATOR_CA, the home's [service] tls_ca, the system's CAs).")(f)
    f = click.option("--token-file", "token_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     envvar="ORCHESTRATOR_TOKEN_FILE", help="With --url: the file holding your bearer token.")(f)
    return click.option("--url", default=None, metavar="URL", envvar="ORCHESTRATOR_URL",
                        help="Reach the service at URL (https://host:port) instead of the home's socket.")(f)


def remote_of() -> dict[str, Any]:
    """``url``, ``token`` and ``ca`` given to ``orchestrator`` (:func:`remote_options`), for ``Orchestrator``."""
    params = click.get_current_context().find_root().params
    if not params.get("url"):
        return {}
    token_file = params.get("token_file")
    token = Path(token_file).expanduser().read_text(encoding="utf-8").strip() if token_file else None
    return {"url": params["url"], "token": token, "ca": params.get("ca")}


def repository_of(repository: str | None = None) -> str | None:
    """``--repository`` of the command, else of ``orchestrator`` itself, else ``None`` (the home's settings)."""
    if repository is None:
        repository = click.get_current_context().find_root().params.get("repository")
    return repository


def home_of(home: Path | None) -> Path:
    if home is None:
        home = click.get_current_context().find_root().params.get("home")
    return Path(home).expanduser().resolve() if home is not None else default_home()


def run(home: Path | None, body: Callable[[Orchestrator], Awaitable[T]], *, refresh: bool = False,
        read_only: bool = False) -> T:
    """Open the home (through its service if one holds it), run ``body``, close it.

    ``refresh``: ask the backends for news first (a listing on a home opened here, where no monitoring
    ran between commands; a service's is current). ``read_only``: a command that only reads (``jobs``,
    ``show``, ``peek``) reads a home another process holds, as SQLite's WAL lets it.
    """
    path = home_of(home)
    url = repository_of()
    remote = remote_of()
    if read_only and not remote and not url and not path.is_dir():  # a reader never makes a home: a typo says so
        raise CliError(f"no home at {path}: check --home or $ORCHESTRATOR_HOME (a command that adds a job, "
                       "such as 'orchestrator submit', makes one)")

    async def main(readonly: bool) -> T:
        role = READER_ROLE if read_only else ""  # a writer that comes meanwhile waits for us, not fails
        async with Orchestrator(home=path, readonly=readonly, service=False if readonly else None,
                                role=role, repository=url, **remote) as orch:
            if refresh and not orch.remote and not readonly:
                await orch.transport.handle(RefreshRequest())
                with anyio.move_on_after(30):  # what the news set going (a merge) finishes first
                    await orch.runtime.settle()
            result = await body(orch)
            if read_only and not orch.remote:
                _say_if_unwatched(orch, path, last_open)
            return result

    last_open = _last_open(path)
    if read_only and not remote and on_read_only_media(path):  # nobody writes it: read it as it is, unlocked
        return anyio.run(main, True)
    try:
        return anyio.run(main, False)
    except HomeLockedError as exc:
        # a shared repository whose writer does not answer here (another host's service) is read as it is
        readable = isinstance(exc, RepositoryHeldError) or ("orchestrator service" not in str(exc)
                                                            and _has_repository(path, url))
        if not read_only or not readable:
            raise CliError(f"{exc}; to share a home between processes, run 'orchestrator --home {path} serve': "
                           "every command then goes through it") from None
        return anyio.run(main, True)


def _last_open(home: Path) -> float | None:
    """When a process last let go of (or took) the home: its lock file's time."""
    try:
        return (home / "lock").stat().st_mtime
    except OSError:
        return None


def _say_if_unwatched(orch: Orchestrator, home: Path, last_open: float | None) -> None:
    """With no service and no watcher to come (autostart off), active jobs' statuses wait for the next command
    that opens the home: say since when, and how to have it watched."""
    from ..api.watcher import autostart

    if not any(job.is_active() for job in orch.jobs):
        return
    if orch.runtime.readonly:
        return  # another process holds the home: it watches
    if autostart(home, bool(orch.config.section("service")["autostart"])):
        return  # closing this command starts the home's watcher
    when = (dt.datetime.fromtimestamp(last_open).strftime("%Y-%m-%d %H:%M:%S") if last_open else "never")
    Console(stderr=True).print(Text(
        f"note: nobody watches {home} (no service; [service] autostart is off): active jobs advance only while a "
        f"command has the home open; last open {when}. Watch it with 'orchestrator --home {home} serve', or set "
        "[service] autostart = true", style="yellow"), soft_wrap=True, highlight=False)


def _has_repository(home: Path, url: str | None) -> bool:
    """Whether there is something to read: the home's SQLite file, or a shared repository named."""
    if url or (home / "repository.sqlite").exists():
        return True
    from ..runtime.config import Config

    return bool(Config.load(home).section("repository").get("url"))


def nothing_to_do(message: str) -> None:
    """Say that nothing was done, and end with the documented exit code."""
    click.echo(message)
    click.get_current_context().exit(NOTHING_TO_DO)
