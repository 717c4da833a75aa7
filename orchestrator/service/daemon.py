"""``orchestrator serve``: one long-running process owning a home.

It holds the home's lock (so no embedded orchestrator opens it meanwhile),
runs the monitoring loop for every active job on every backend, keeps the
event bus, advances workflows, and answers the control API on a Unix socket
(and, when asked, on TCP with a token: on 127.0.0.1 by default, beyond
loopback only with TLS, :mod:`.tls`). Logs are structlog JSON on
stdout, for supervisord to keep.

It is built to be killed. Every submission is written ahead (``submitting``
with its key) before a backend hears of it, and reconciled by key at the
next start; runs at the backends outlive the process and are reattached.
SIGTERM is the polite form: the tick under way finishes, everything is
written, and the process exits 0 well within 10 s. SIGHUP reads the access
settings (``users``, ``admins``, the tokens) again. No client can exhaust
it: connections are capped to fit its descriptor limit (raised to the hard
one at start), and an accept that finds no descriptor waits and tries again
(:class:`.http.Server`).

On a shared (PostgreSQL) repository, services on several homes make an
active/standby pair: each holds its own home and answers on its own socket,
but only the one that holds the repository's lease opens it; the others
answer as standbys (:mod:`.standby`) and look at the lease every
:data:`STANDBY_POLL` seconds. When the active one dies (its session, and so
its lease's lock, goes with it), stops (it gives the lease back) or freezes
(its lease expires), a standby takes the lease, opens the home (runs caught
``submitting`` are looked up by their keys, the rest reattached) and carries
on. An active service that loses its lease (it was frozen past it, or cut off
from the database) steps down: the database refuses its writes, it sends
nothing more to the backends, and it exits with :data:`STEP_DOWN`, for
supervisord to start it again, as a standby.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import signal
import socket
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ..api.embedded import Embedded
from ..api.orchestrator import Orchestrator, default_home
from ..api.owners import current_user
from ..api.paths import ServicePaths
from ..api.watcher import mark_managed
from ..core.errors import ConfigError, HomeLockedError, RepositoryError, RepositoryHeldError, reraise_unwrapped
from ..plugin.logs import configure as configure_logs
from ..plugin.logs import get_logger
from ..plugin.users import configure_python
from ..runtime.config import Config
from ..runtime.homelock import SERVICE_ROLE, WATCHER_ROLE, HomeLock
from ..runtime.storage import Storage
from .access import Access, TokenStore, names, tokens_path
from .api import Api, caller_of
from .control import Control
from .http import Limits, Request, Response, Server, raise_nofile
from .quotas import Quotas
from .standby import Standby
from .tls import HANDSHAKE_TIMEOUT, TcpSettings, tcp_settings
from .trust import check_users, lock_down, others


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
#: Seconds between two looks of a standby at the shared repository's lease.
STANDBY_POLL = 0.5
#: Exit code of an active service that lost the shared repository's lease (EX_TEMPFAIL): start it again.
STEP_DOWN = 75


class Front:
    """What the listeners call: "starting" (or the standby's answers), then, once the home is open, the API;
    "stopping" while the home closes."""

    def __init__(self) -> None:
        self.handler: Any = None
        self.stopping = False

    async def __call__(self, req: Request) -> Response:
        if self.handler is None:
            state = "stopping" if self.stopping else "starting"
            return Response.json({"error": state, "message": f"the orchestrator service is {state}",
                                  "fqid": None, "field": None}, 503)
        return await self.handler(req)  # type: ignore[no-any-return]


async def run_service(home: Path | None, *, tcp_port: int | None = None, token_file: Path | None = None,
                      config: dict[str, Any] | None = None, repository: str | None = None,
                      tcp_host: str | None = None, watcher: bool = False) -> int:
    """Serve ``home`` until SIGTERM or SIGINT (or, active on a shared repository, until it loses the lease; or, a
    ``watcher``, once nothing has been active for a while); returns the exit code."""
    configure_logs(json=True, level="INFO", stream=sys.stdout)
    log = get_logger(component="service")
    started = time.time()
    path = Path(home).expanduser().resolve() if home is not None else default_home()
    overrides = dict(config or {})
    if repository is not None:
        overrides["repository"] = {**overrides.get("repository", {}), "url": repository}
    path.mkdir(parents=True, exist_ok=True)
    settings = Config.load(path, overrides)
    section = settings.section("service")
    named = names(section, "users") | names(section, "admins") | set(TokenStore(tokens_path(path)).users())
    check_users(named, current_user())  # a multi-user service needs root: refused here, before anything is made
    configure_python(str(section.get("python") or "") or None)
    multi = bool(others(named, current_user()))
    lock_down(path, multi)
    data_dir = Storage.of(path, settings.section("repository")).data_dir
    if data_dir != path:  # a shared repository's workspaces and backends' state: its owners cross it too
        lock_down(data_dir, multi)
    lock = HomeLock(path / "lock", WATCHER_ROLE if watcher else SERVICE_ROLE)
    # Signals are caught from here on: a SIGTERM while the home loads waits, then stops the service cleanly;
    # SIGHUP reads the access settings again.
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        if watcher:
            try:
                lock.acquire()
            except HomeLockedError:  # another process watches it, or opened it since: nothing to do
                return 0
        else:
            mark_managed(path)
            await take_from_watcher(lock, log)
        try:
            quiet = float(section["watcher_quiet_seconds"]) if watcher else None
            service = Service(path, overrides, settings, lock, started, log, quiet=quiet)
            code = await service.run(signals, tcp_port, token_file, tcp_host)
        finally:
            lock.release()
    log.info("stopped", seconds=round(time.time() - started, 3), code=code)
    return code


class Service:
    """One ``orchestrator serve``: see the module docstring."""

    def __init__(self, home: Path, overrides: dict[str, Any], settings: Config, lock: HomeLock, started: float,
                 log: Any, *, quiet: float | None = None) -> None:
        self.home = home
        self.overrides = overrides
        self.settings = settings
        self.storage = Storage.of(home, settings.section("repository"))
        self.lock = lock
        self.started = started
        self.log = log
        self.paths = ServicePaths(home)
        self.stop_asked = anyio.Event()
        self.signalled = 0.0
        #: A watcher's quiet period: it stops once nothing has been active for this many seconds.
        self.quiet = quiet

    async def run(self, signals: Any, tcp_port: int | None, token_file: Path | None,
                  tcp_host: str | None = None) -> int:
        section = self.settings.section("service")
        grace = float(section["stop_timeout"])
        port = tcp_port if tcp_port is not None else int(section["tcp_port"])
        tokens = token_file or (Path(section["token_file"]).expanduser() if section["token_file"] else None)
        limits = limits_of(section)
        Quotas(section, None, lambda job: None)  # its settings checked before the home opens
        if tokens is not None and port < 0:
            raise ConfigError("a token file is for the TCP listener: give --tcp-port (or [service] tcp_port) too")
        self.token_path = tokens or self.paths.dir / "token"
        self.tcp = tcp_settings(section, tcp_host) if port >= 0 else TcpSettings("127.0.0.1", None)
        self.access = Access.of(section, self.home, read_token(self.token_path, create=True) if port >= 0 else None)
        nofile = raise_nofile()
        self.limits = limits.fitted(nofile)
        if self.limits.max_connections < limits.max_connections:
            self.log.info("connections capped to fit the descriptor limit", nofile=nofile,
                          max_connections=self.limits.max_connections)
        try:
            return await self._serve(signals, port, grace)
        except BaseExceptionGroup as group:  # one error inside the task groups: the one the user reads
            reraise_unwrapped(group)
            raise
        finally:
            self.paths.info.unlink(missing_ok=True)
            self.paths.socket.unlink(missing_ok=True)

    async def _serve(self, signals: Any, port: int, grace: float) -> int:
        """The listeners outside, the home inside: the home is closed (after the API stopped answering and the
        workflows let go of it) before the sockets close."""
        code = 0
        front = Front()
        async with anyio.create_task_group() as listeners:
            listeners.start_soon(self._watch_signals, signals)
            try:
                async with AsyncExitStack() as stack:
                    orch = None if self.storage.shared else await self._open(stack)
                    bound = await self._listen(listeners, front, port)
                    self.access.port = bound
                    if orch is None:
                        standby = front.handler = Standby(self.home, self.storage.where, self.access)
                        self._write_info(bound, "standby")
                        self.log.info("service standby", home=str(self.home), repository=self.storage.where,
                                      socket=str(self.paths.socket), tcp_port=bound)
                        orch = await self._wait_and_open(stack, standby)
                    if orch is not None:
                        async with anyio.create_task_group() as tg:
                            # a damaged workflows.sqlite refuses the start, as the repository does
                            workflows = await tg.start(_host_workflows, orch)
                            code = await self._active(orch, front, bound, grace, workflows)
                            tg.cancel_scope.cancel()
                    front.handler = None
                    front.stopping = True
            except RepositoryHeldError as exc:  # the last write of one that lost the lease: refused
                self.log.error("the repository refused this service's last write", error=str(exc))
                code = STEP_DOWN
            except RepositoryError as exc:  # the database went away: the lease was lost that way
                if code != STEP_DOWN:
                    raise
                self.log.error("the last write could not reach the repository", error=str(exc))
            listeners.cancel_scope.cancel()
        return code

    async def _open(self, stack: AsyncExitStack) -> Orchestrator:
        orch = Orchestrator(home=self.home, config=self.overrides, role="service", service=False, lock=self.lock)
        await stack.enter_async_context(orch)
        return orch

    async def _watch_signals(self, signals: Any) -> None:
        async for signum in signals:
            if signum == signal.SIGHUP:
                self._reload()
                continue
            self.log.info("stopping", signal=signal.Signals(signum).name)
            self.signalled = time.monotonic()
            self.stop_asked.set()
            return

    def _reload(self) -> None:
        """SIGHUP: ``[service] users`` and ``admins``, the token file and the users' tokens read again; a
        client they no longer let in is refused from its next request on, and its event streams close."""
        try:
            section = Config.load(self.home, self.overrides).section("service")
            token = read_token(self.token_path, create=False) if self.access.token is not None else None
            self.access.reload(section, token)
        except (ConfigError, OSError, ValueError) as exc:
            self.log.error("SIGHUP: the settings were not reloaded; the old ones stay", error=str(exc))
            return
        if self.paths.socket.exists():  # a home that became shared opens its socket, one no longer shared closes it
            os.chmod(self.paths.dir, 0o711 if self.access.shared else 0o700)
            os.chmod(self.paths.socket, 0o666 if self.access.shared else 0o600)
        self.log.info("reloaded the access settings", users=sorted(self.access.users),
                      admins=sorted(self.access.admins))

    async def _listen(self, tg: TaskGroup, front: Front, port: int) -> int | None:
        """The Unix socket (and TCP, when asked); the TCP port bound."""
        shared = self.access.shared
        self.paths.dir.mkdir(mode=0o700, exist_ok=True)
        # Shared: others may reach the socket (not list the directory); every request's peer uid is checked.
        os.chmod(self.paths.dir, 0o711 if shared else 0o700)
        self.paths.socket.unlink(missing_ok=True)  # left by a killed service: we hold the home's lock, it is ours
        unix = await anyio.create_unix_listener(self.paths.socket, mode=0o666 if shared else 0o600)
        access = self.access
        server = Server(front, self.limits, screen=lambda req: refused if isinstance(
            refused := caller_of(req, access), Response) else None)
        tg.start_soon(server.serve, unix, "unix", tg)
        if port < 0:
            return None
        host = self.tcp.host
        try:
            tcp = await anyio.create_tcp_listener(local_host=host, local_port=port,
                                                  family=socket.AF_INET if host == "127.0.0.1" else socket.AF_UNSPEC)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        for one in tcp.listeners:  # HTTPS with TLS: each connection's handshake first, then h11 as on the socket
            tg.start_soon(server.serve, one, "tcp", tg, self.tcp.tls, HANDSHAKE_TIMEOUT)
        return int(tcp.extra(anyio.abc.SocketAttribute.local_port))

    async def _wait_and_open(self, stack: AsyncExitStack, standby: Standby) -> Orchestrator | None:
        """As a standby: look at the lease until it is free, then open the home (``None``: asked to stop)."""
        from ..runtime.postgres.connect import LeaseWatch  # a shared repository's code, loaded only for one

        watch = LeaseWatch(self.storage.url)
        try:
            while not self.stop_asked.is_set():
                try:
                    view = await watch.look()
                except RepositoryError as exc:
                    self.log.warning("cannot look at the repository's lease", error=str(exc))
                    standby.saw(None)
                else:
                    standby.saw(view)
                    if view is None or view.free:
                        try:
                            orch = await self._open(stack)
                        except RepositoryHeldError as exc:
                            self.log.info("another service took the lease first", error=str(exc))
                        else:
                            self.log.info("took over", repository=self.storage.where,
                                          from_holder=view.holder if view is not None else None,
                                          standby_seconds=round(time.time() - standby.since, 3))
                            return orch
                with anyio.move_on_after(STANDBY_POLL):
                    await self.stop_asked.wait()
        finally:
            await watch.close()
        return None

    async def _active(self, orch: Orchestrator, front: Front, bound: int | None, grace: float,
                      workflows: Any = None) -> int:
        """Answer, monitor and write until a signal (exit 0) or the lease's loss (:data:`STEP_DOWN`)."""
        runtime = orch.runtime
        embedded = Embedded(runtime)
        quotas = Quotas(self.settings.section("service"), runtime.sm, embedded.statuses().owner)
        runtime.preparer.admission = quotas.admit
        api = Api(Control(embedded, quotas), runtime.bus, access=self.access,
                  metrics=runtime.enable_prometheus().render, workflows=workflows)
        front.handler = api
        address = self._write_info(bound, "active")
        await runtime.repo.announce(address)
        page = (f"{self.tcp.url(bound)}/?token=$(cat {self.token_path})" if bound is not None else
                "off: it needs TCP; start with --tcp-port PORT (0: any free port) or set [service] tcp_port")
        self.log.info("service ready", home=str(self.home), socket=str(self.paths.socket), tcp_port=bound,
                      tcp_host=self.tcp.host if bound is not None else None, tls=self.tcp.tls is not None,
                      repository=self.storage.where, jobs=len(runtime.sm.job_ids()),
                      start_seconds=round(time.time() - self.started, 3), status_page=page,
                      owner=self.access.owner, users=sorted(self.access.users), admins=sorted(self.access.admins))
        lost = ""
        async with anyio.create_task_group() as until:
            async def on_lost() -> None:
                nonlocal lost
                lost = await runtime.repo.lost() or "lost"
                until.cancel_scope.cancel()

            async def on_stop() -> None:
                await self.stop_asked.wait()
                until.cancel_scope.cancel()

            until.start_soon(on_lost)
            until.start_soon(on_stop)
            if self.quiet is not None:
                until.start_soon(self._stop_when_quiet, orch, self.quiet)
        if lost:
            self.log.error(f"lost the repository's lease: stepping down (exit {STEP_DOWN}), nothing more is "
                           "written or sent", repository=self.storage.where, reason=lost)
            orch.config.core["close_grace"] = 0.0
            return STEP_DOWN
        with anyio.move_on_after(grace):
            await runtime.quiesce()  # the work under way finishes; no new tick begins
        # Closing the home waits core.close_grace (60 s) for retries and mergers under way: the service
        # gives them only what is left of its stop budget (a submission cut short is settled at the next start).
        left = STOP_WITHIN - CLOSE_MARGIN - (time.monotonic() - self.signalled)
        orch.config.core["close_grace"] = max(0.0, min(float(orch.config.core["close_grace"]), left))
        return 0

    async def _stop_when_quiet(self, orch: Orchestrator, quiet: float) -> None:
        """A watcher's end: nothing active (no job, no postprocessing) for ``quiet`` seconds."""
        since = time.monotonic()
        while True:
            await anyio.sleep(max(0.05, min(5.0, quiet / 4)))
            if any(job.is_active() for job in orch.jobs):
                since = time.monotonic()
            elif time.monotonic() - since >= quiet:
                self.log.info("stopping: nothing active", quiet_seconds=quiet)
                self.signalled = time.monotonic()
                self.stop_asked.set()
                return

    def _write_info(self, bound: int | None, role: str) -> dict[str, Any]:
        """``<home>/service/service.json``: where this service answers; also what the lease publishes."""
        tcp = getattr(self, "tcp", TcpSettings("127.0.0.1", None))
        info = {"pid": os.getpid(), "socket": str(self.paths.socket), "tcp_port": bound, "host": tcp.host,
                "tls": tcp.tls is not None, "url": tcp.url(bound) if bound is not None else None,
                "hostname": socket.gethostname(), "home": str(self.home), "started": self.started, "role": role}
        tmp = self.paths.info.with_suffix(".tmp")
        tmp.write_text(json.dumps(info) + "\n")
        os.chmod(tmp, 0o644)  # clients of a shared service read it, whatever the umask (supervisord's is 077)
        tmp.replace(self.paths.info)
        return info


def limits_of(section: dict[str, Any]) -> Limits:
    """The HTTP server's limits from ``[service]``, checked."""
    def number(key: str, low: float, kind: type = int) -> Any:
        value = section.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value < low:
            what = "a number" if kind is float else "an integer"
            raise ConfigError(f"service.{key} must be {what} of at least {low:g}, not {value!r}")
        return kind(value)

    return Limits(max_body=number("max_request_bytes", 1024), max_connections=number("max_connections", 8),
                  max_per_peer=number("max_connections_per_peer", 1),
                  header_timeout=number("header_timeout", 0.1, float), idle_timeout=number("idle_timeout", 0.1, float))


async def take_from_watcher(lock: HomeLock, log: Any, wait: float = 20.0) -> None:
    """Take the home's lock; a watcher holding it is asked to stop (SIGTERM) and waited for."""
    deadline = time.monotonic() + wait
    asked = False
    while True:
        try:
            lock.acquire()
            return
        except HomeLockedError:
            holder = lock.holder()
            if not holder.startswith(WATCHER_ROLE) or time.monotonic() > deadline:
                raise
            if not asked:
                pid = int(holder.split("pid ", 1)[1].split()[0])
                log.info("stopping the home's watcher: this service takes over", pid=pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
                asked = True
            await anyio.sleep(0.1)


async def _host_workflows(orch: Orchestrator, *, task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED) -> None:
    """Workflows advance while the service runs, not only while a user's ``Workflows(orch)`` is open; started,
    it gives the API its handler of workflow commands (``orchestrator workflow ...`` through the service)."""
    from ..features.workflows.cli import serve_command
    from ..features.workflows.runner import Workflows

    async with Workflows(orch) as wfs:
        task_status.started(functools.partial(serve_command, wfs))
        await anyio.sleep_forever()


