"""``orchestrator serve`` and ``orchestrator token``: registered as commands of the ``orchestrator.commands``
entry-point group, so that the command line never imports the service (it sits above the CLI)."""

from __future__ import annotations

from pathlib import Path

import anyio
import click

from ..api.owners import current_user, home_owner
from ..cli.app import CliError, home_of, home_option, repository_of, repository_option
from ..runtime.config import Config
from .access import TokenStore, names, tokens_path
from .daemon import run_service


@click.command()
@click.option("--tcp-port", type=int, default=None,
              help="Also listen on TCP port PORT (0: any free port), bearer token required. Default: [service].")
@click.option("--tcp-host", default=None, metavar="HOST",
              help="Where the TCP port listens (default: [service] tcp_host, 127.0.0.1); beyond loopback only with "
                   "TLS ([service] tls_cert and tls_key).")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The bearer token for TCP clients (created, mode 0600, if missing). "
                   "Default: [service] token_file, else <home>/service/token.")
@click.option("--watcher", is_flag=True,
              help="Serve as the home's watcher: stop once nothing has been active for [service] "
                   "watcher_quiet_seconds, and leave quietly if another process holds the home. Started by itself "
                   "when a command leaves active jobs on a home nobody serves.")
@repository_option
@home_option
def serve(tcp_port: int | None, tcp_host: str | None, token_file: Path | None, watcher: bool,
          repository: str | None,
          home: Path | None) -> None:
    """Run the service on a home until SIGTERM: monitoring, control API on a Unix socket, status page.

    On a shared (PostgreSQL) repository, the service that holds its lease is active and the others wait as
    standbys; one that loses the lease exits with code 75, for supervisord to start it again as a standby.
    A plain serve (supervisord's) marks the home as served, so no watcher is ever started for it, and stops a
    watcher it finds holding the home.
    """
    path = home_of(home)
    url = repository_of(repository)
    click.get_current_context().exit(anyio.run(lambda: run_service(path, tcp_port=tcp_port, token_file=token_file,
                                                                   repository=url, tcp_host=tcp_host,
                                                                   watcher=watcher)))


@click.command()
@click.argument("user", required=False)
@click.option("--revoke", is_flag=True, help="Turn USER's token off.")
@click.option("--list", "list_", is_flag=True, help="List the users who have a token.")
@home_option
def token(user: str | None, revoke: bool, list_: bool, home: Path | None) -> None:
    """Print a new token for USER to reach the service over TCP (replacing theirs).

    \b
    USER must be named by [service] users or admins in the home's
    orchestrator.toml (or be the service's own user). The token is printed
    once and kept only as its SHA-256, in <home>/service/tokens (mode 0600);
    a running service takes it at once. USER then sees and acts on their
    own jobs (every job for an admin). The service's own token file keeps
    working.
    """
    path = home_of(home)
    store = TokenStore(tokens_path(path))
    if list_:
        for name in store.users():
            click.echo(name)
        return
    if user is None:
        raise click.UsageError("name the user: orchestrator token USER")
    if revoke:
        if not store.revoke(user):
            raise CliError(f"user {user} has no token on {path}")
        click.echo(f"user {user}: token revoked")
        return
    if not path.is_dir():
        raise CliError(f"no orchestrator home at {path}")
    settings = Config.load(path).section("service")
    allowed = names(settings, "users") | names(settings, "admins") | {current_user(), home_owner(path)}
    if user not in allowed:
        raise CliError(f"user {user} is not named by [service] users or admins in {path / 'orchestrator.toml'}: "
                       f"add them there first")
    click.echo(store.issue(user))
