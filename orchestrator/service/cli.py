"""``orchestrator serve``: registered as a command of the ``orchestrator.commands`` entry-point group, so that
the command line never imports the service (it sits above the CLI)."""

from __future__ import annotations

from pathlib import Path

import anyio
import click

from ..cli.app import home_of, home_option, repository_of, repository_option
from .daemon import run_service


@click.command()
@click.option("--tcp-port", type=int, default=None,
              help="Also listen on 127.0.0.1:PORT (0: any free port), bearer token required. Default: [service].")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The bearer token for TCP clients (created, mode 0600, if missing). "
                   "Default: [service] token_file, else <home>/service/token.")
@repository_option
@home_option
def serve(tcp_port: int | None, token_file: Path | None, repository: str | None, home: Path | None) -> None:
    """Run the service on a home until SIGTERM: monitoring, control API on a Unix socket, status page.

    On a shared (PostgreSQL) repository, the service that holds its lease is active and the others wait as
    standbys; one that loses the lease exits with code 75, for supervisord to start it again as a standby.
    """
    path = home_of(home)
    url = repository_of(repository)
    click.get_current_context().exit(anyio.run(lambda: run_service(path, tcp_port=tcp_port, token_file=token_file,
                                                                   repository=url)))
