"""``wms``: the command group of the emulated gLite WMS (``orchestrator wms serve``, ``python -m orch_glite``).

A click group object, so that the main ``orchestrator`` command can mount it
with ``main.add_command(wms_group)`` and the service can run on its own
without the orchestrator's CLI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import click

from orchestrator.plugin import SettingsError

from .protocol import WMSFault, call, check_faults, parse_endpoint, parse_listen


def _faults(ctx: click.Context, param: click.Parameter, value: str | None) -> dict[str, Any]:
    """``--faults`` is a JSON object, or ``@FILE`` holding one."""
    if not value:
        return {}
    text = Path(value[1:]).read_text() if value.startswith("@") else value
    try:
        return check_faults(json.loads(text))
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", ctx, param) from None
    except (SettingsError, AttributeError, TypeError) as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _listen(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        parse_listen(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    return value


@click.group(name="wms", context_settings={"help_option_names": ["-h", "--help"]})
def wms_group() -> None:
    """The emulated gLite WMS behind the 'glite' backend."""


@wms_group.command()
@click.option("--listen", default="127.0.0.1:0", show_default=True, callback=_listen,
              help="Loopback HOST:PORT to listen on (PORT 0: any free port; see STATE/endpoint).")
@click.option("--state", "statedir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory of the service's state (database, events file, wrapper scripts).")
@click.option("--max-running", default=64, show_default=True, type=click.IntRange(1),
              help="Most nodes running at once; the others wait, submitted.")
@click.option("--faults", default=None, callback=_faults,
              help='Service-wide fault injection, JSON or @FILE: {"reject": [k], "abort": {"k": s}, '
                   '"status_delay": s, "drop": {"status": n}, "garbage": {"submit": n}}.')
@click.option("--launch-grace", default=15.0, show_default=True, type=click.FloatRange(0),
              help="Seconds a node caught mid-launch by a restart may take to show up before it is aborted.")
@click.option("--kill-grace", default=2.0, show_default=True, type=click.FloatRange(0),
              help="Seconds between SIGTERM and SIGKILL of a cancelled node.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def serve(listen: str, statedir: Path, max_running: int, faults: dict[str, Any], launch_grace: float,
          kill_grace: float, log_level: str) -> None:
    """Run the WMS until SIGTERM or SIGINT (JSON logs on stderr). Running nodes outlive it."""
    from orchestrator.plugin.logs import configure

    from .wms import StateLocked
    from .wms import serve as serve_wms

    configure(json=True, level=log_level)
    try:
        anyio.run(lambda: serve_wms(listen, statedir, max_running=max_running, faults=faults,
                                    launch_grace=launch_grace, kill_grace=kill_grace))
    except StateLocked as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {listen}: {exc}") from None


@wms_group.command()
@click.argument("endpoint")
@click.option("--timeout", default=5.0, show_default=True, type=float)
def ping(endpoint: str, timeout: float) -> None:
    """Ask the WMS at ENDPOINT (http://127.0.0.1:PORT) whether it is up; exit 1 if not."""
    try:
        parse_endpoint(endpoint)
        answer = anyio.run(lambda: call(endpoint, "GET", "/v1/ping", timeout=timeout))
    except (ValueError, WMSFault) as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from None
    click.echo(json.dumps(answer))
