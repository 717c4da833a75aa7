"""``orchestrator serve``: one long-running process owning a home.

It holds the home's lock (so no embedded orchestrator opens it meanwhile),
runs the monitoring loop for every active job on every backend, keeps the
event bus, advances workflows, and answers the control API on a Unix socket
(and, when asked, on 127.0.0.1 with a token), to its owner and the users its
settings name (:mod:`.access`). Logs are structlog JSON on
stdout, for supervisord to keep.

It is built to be killed. Every submission is written ahead (``submitting``
with its key) before a backend hears of it, and reconciled by key at the
next start; runs at the backends outlive the process and are reattached.
SIGTERM is the polite form: the tick under way finishes, everything is
written, and the process exits 0 well within 10 s.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Listener, TaskGroup, TaskStatus

from ..api.embedded import Embedded
from ..api.orchestrator import Orchestrator
from ..api.paths import ServicePaths
from ..core.errors import ConfigError
from ..plugin.logs import configure as configure_logs
from ..plugin.logs import get_logger
from .access import Access
from .api import Api
from .control import Control
from .http import serve_connection


def read_token(path: Path, *, create: bool) -> str:
    """The bearer token in ``path``; a new random one (file mode 0600) when it is missing and ``create``."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        if not create:
            raise ConfigError(f"token file {path} does not exist") from None
        token = secrets.token_urlsafe(32)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    if path.stat().st_mode & 0o077:
        raise ConfigError(f"token file {path}: others may read it; chmod 600 it")
    if len(token) < 16:
        raise ConfigError(f"token file {path}: the token must have at least 16 characters")
    return token


#: Seconds from SIGTERM to the process's exit (README, config/supervisord.conf).
STOP_WITHIN = 10.0
#: Of those, kept for the last write of every change and closing the drivers and the repository.
CLOSE_MARGIN = 2.0


async def run_service(home: Path | None, *, tcp_port: int | None = None, token_file: Path | None = None,
                      config: dict[str, Any] | None = None) -> int:
    """Serve ``home`` until SIGTERM or SIGINT; returns the exit code."""
    configure_logs(json=True, level="INFO", stream=sys.stdout)
    log = get_logger(component="service")
    started = time.time()
    orch = Orchestrator(home=home, config=config, role="service", service=False)
    # Signals are caught from here on: a SIGTERM while the home loads waits, then stops the service cleanly.
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with orch:
            await _serve(orch, signals, tcp_port, token_file, started, log)
    log.info("stopped", seconds=round(time.time() - started, 3))
    return 0


async def _serve(orch: Orchestrator, signals: Any, tcp_port: int | None, token_file: Path | None,
                 started: float, log: Any) -> None:
    """Listen, answer and monitor until a signal; then stop within the budget, leaving the home to close."""
    settings = orch.config.section("service")
    grace = float(settings["stop_timeout"])
    port = tcp_port if tcp_port is not None else int(settings["tcp_port"])
    tokens = token_file or (Path(settings["token_file"]).expanduser() if settings["token_file"] else None)
    max_body = settings["max_request_bytes"]
    if not isinstance(max_body, int) or isinstance(max_body, bool) or max_body < 1024:
        raise ConfigError(f"service.max_request_bytes must be an integer of at least 1024, not {max_body!r}")
    token = None
    if tokens is not None and port < 0:
        raise ConfigError("a token file is for the TCP listener: give --tcp-port (or [service] tcp_port) too")
    if port >= 0:
        token = read_token(tokens or ServicePaths(orch.home).dir / "token", create=True)
    access = Access.of(settings, orch.home, token)
    paths = ServicePaths(orch.home)
    paths.dir.mkdir(mode=0o700, exist_ok=True)
    # Shared: others may reach the socket (not list the directory); every request's peer uid is checked.
    os.chmod(paths.dir, 0o711 if access.shared else 0o700)
    paths.socket.unlink(missing_ok=True)  # left by a killed service: we hold the home's lock, it is ours
    runtime = orch.runtime
    api = Api(Control(Embedded(runtime)), runtime.bus, access=access, metrics=runtime.enable_prometheus().render)
    async with anyio.create_task_group() as tg:
        await tg.start(_host_workflows, orch)  # a damaged workflows.sqlite refuses the start, as the repository does
        unix = await anyio.create_unix_listener(paths.socket, mode=0o666 if access.shared else 0o600)
        tg.start_soon(_accept, unix, api, "unix", tg, max_body)
        bound: int | None = None
        if port >= 0:
            try:
                tcp = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port,
                                                      family=socket.AF_INET)
            except OSError as exc:
                raise ConfigError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}") from None
            bound = int(tcp.extra(anyio.abc.SocketAttribute.local_port))
            tg.start_soon(_accept, tcp, api, "tcp", tg, max_body)
        _write_info(paths, {"pid": os.getpid(), "socket": str(paths.socket), "tcp_port": bound,
                            "host": "127.0.0.1", "started": started})
        token_path = tokens or ServicePaths(orch.home).dir / "token"
        page = (f"http://127.0.0.1:{bound}/?token=$(cat {token_path})" if bound is not None else
                "off: it needs TCP; start with --tcp-port PORT (0: any free port) or set [service] tcp_port")
        log.info("service ready", home=str(orch.home), socket=str(paths.socket), tcp_port=bound,
                 jobs=len(runtime.sm.job_ids()), start_seconds=round(time.time() - started, 3), status_page=page,
                 owner=access.owner, users=sorted(access.users), admins=sorted(access.admins))
        async for signum in signals:
            log.info("stopping", signal=signal.Signals(signum).name)
            break
        signalled = time.monotonic()
        with anyio.move_on_after(grace):
            await runtime.quiesce()  # the work under way finishes; no new tick begins
        tg.cancel_scope.cancel()
        # Closing the home waits core.close_grace (60 s) for retries and mergers under way: the service
        # gives them only what is left of its stop budget (a submission cut short is settled at the next start).
        left = STOP_WITHIN - CLOSE_MARGIN - (time.monotonic() - signalled)
        orch.config.core["close_grace"] = max(0.0, min(float(orch.config.core["close_grace"]), left))
    paths.info.unlink(missing_ok=True)
    paths.socket.unlink(missing_ok=True)


async def _accept(listener: Listener[Any], api: Api, via: str, tg: TaskGroup, max_body: int) -> None:
    async def connection(stream: Any) -> None:
        await serve_connection(stream, api, via, max_body)

    async with listener:
        await listener.serve(connection, task_group=tg)


async def _host_workflows(orch: Orchestrator, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Workflows advance while the service runs, not only while a user's ``Workflows(orch)`` is open."""
    from ..features.workflows.runner import Workflows

    async with Workflows(orch):
        task_status.started()
        await anyio.sleep_forever()


def _write_info(paths: ServicePaths, info: dict[str, Any]) -> None:
    tmp = paths.info.with_suffix(".tmp")
    tmp.write_text(json.dumps(info) + "\n")
    tmp.replace(paths.info)
