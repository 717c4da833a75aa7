"""``orchestrator serve``: one long-running process owning a home.

It holds the home's lock (so no embedded orchestrator opens it meanwhile),
runs the monitoring loop for every active job on every backend, keeps the
event bus, advances workflows, and answers the control API on a Unix socket
(and, when asked, on 127.0.0.1 with a token). Logs are structlog JSON on
stdout, for supervisord to keep.

It is built to be killed. Every submission is written ahead (``submitting``
with its key) before a backend hears of it, and reconciled by key at the
next start; runs at the backends outlive the process and are reattached.
SIGTERM is the polite form: the tick under way finishes, everything is
written, and the process exits 0 well within 10 s.

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
from anyio.abc import Listener, TaskGroup, TaskStatus

from ..api.embedded import Embedded
from ..api.orchestrator import Orchestrator, default_home
from ..api.paths import ServicePaths
from ..api.watcher import mark_managed
from ..core.errors import ConfigError, HomeLockedError, RepositoryError, RepositoryHeldError, leaves
from ..plugin.logs import configure as configure_logs
from ..plugin.logs import get_logger
from ..runtime.config import Config
from ..runtime.homelock import SERVICE_ROLE, WATCHER_ROLE, HomeLock
from ..runtime.storage import Storage
from .access import Access
from .api import Api
from .control import Control
from .http import Request, Response, serve_connection
from .standby import Standby


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
                      watcher: bool = False) -> int:
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
    lock = HomeLock(path / "lock", WATCHER_ROLE if watcher else SERVICE_ROLE)
    # Signals are caught from here on: a SIGTERM while the home loads waits, then stops the service cleanly.
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        if watcher:
            try:
                lock.acquire()
            except HomeLockedError:  # another process watches it, or opened it since: nothing to do
                return 0
        else:
            mark_managed(path)
            await take_from_watcher(lock, log)
        try:
            quiet = float(settings.section("service")["watcher_quiet_seconds"]) if watcher else None
            service = Service(path, overrides, settings, lock, started, log, quiet=quiet)
            code = await service.run(signals, tcp_port, token_file)
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

    async def run(self, signals: Any, tcp_port: int | None, token_file: Path | None) -> int:
        section = self.settings.section("service")
        grace = float(section["stop_timeout"])
        port = tcp_port if tcp_port is not None else int(section["tcp_port"])
        tokens = token_file or (Path(section["token_file"]).expanduser() if section["token_file"] else None)
        max_body = section["max_request_bytes"]
        if not isinstance(max_body, int) or isinstance(max_body, bool) or max_body < 1024:
            raise ConfigError(f"service.max_request_bytes must be an integer of at least 1024, not {max_body!r}")
        if tokens is not None and port < 0:
            raise ConfigError("a token file is for the TCP listener: give --tcp-port (or [service] tcp_port) too")
        self.token_path = tokens or self.paths.dir / "token"
        self.access = Access.of(section, self.home, read_token(self.token_path, create=True) if port >= 0 else None)
        try:
            return await self._serve(signals, port, max_body, grace)
        except BaseExceptionGroup as group:  # one error inside the task groups: the one the user reads
            inner = leaves(group)
            if len(inner) == 1:
                raise inner[0] from None
            raise
        finally:
            self.paths.info.unlink(missing_ok=True)
            self.paths.socket.unlink(missing_ok=True)

    async def _serve(self, signals: Any, port: int, max_body: int, grace: float) -> int:
        """The listeners outside, the home inside: the home is closed (after the API stopped answering and the
        workflows let go of it) before the sockets close."""
        code = 0
        front = Front()
        async with anyio.create_task_group() as listeners:
            listeners.start_soon(self._watch_signals, signals)
            try:
                async with AsyncExitStack() as stack:
                    orch = None if self.storage.shared else await self._open(stack)
                    bound = await self._listen(listeners, front, port, max_body)
                    if orch is None:
                        standby = front.handler = Standby(self.home, self.storage.where, self.access)
                        self._write_info(bound, "standby")
                        self.log.info("service standby", home=str(self.home), repository=self.storage.where,
                                      socket=str(self.paths.socket), tcp_port=bound)
                        orch = await self._wait_and_open(stack, standby)
                    if orch is not None:
                        async with anyio.create_task_group() as tg:
                            # a damaged workflows.sqlite refuses the start, as the repository does
                            await tg.start(_host_workflows, orch)
                            code = await self._active(orch, front, bound, grace)
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
            self.log.info("stopping", signal=signal.Signals(signum).name)
            self.signalled = time.monotonic()
            self.stop_asked.set()
            return

    async def _listen(self, tg: TaskGroup, front: Front, port: int, max_body: int) -> int | None:
        """The Unix socket (and TCP, when asked); the TCP port bound."""
        shared = self.access.shared
        self.paths.dir.mkdir(mode=0o700, exist_ok=True)
        # Shared: others may reach the socket (not list the directory); every request's peer uid is checked.
        os.chmod(self.paths.dir, 0o711 if shared else 0o700)
        self.paths.socket.unlink(missing_ok=True)  # left by a killed service: we hold the home's lock, it is ours
        unix = await anyio.create_unix_listener(self.paths.socket, mode=0o666 if shared else 0o600)
        tg.start_soon(_accept, unix, front, "unix", tg, max_body)
        if port < 0:
            return None
        try:
            tcp = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port, family=socket.AF_INET)
        except OSError as exc:
            raise ConfigError(f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}") from None
        tg.start_soon(_accept, tcp, front, "tcp", tg, max_body)
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

    async def _active(self, orch: Orchestrator, front: Front, bound: int | None, grace: float) -> int:
        """Answer, monitor and write until a signal (exit 0) or the lease's loss (:data:`STEP_DOWN`)."""
        runtime = orch.runtime
        api = Api(Control(Embedded(runtime)), runtime.bus, access=self.access,
                  metrics=runtime.enable_prometheus().render)
        front.handler = api
        address = self._write_info(bound, "active")
        await runtime.repo.announce(address)
        page = (f"http://127.0.0.1:{bound}/?token=$(cat {self.token_path})" if bound is not None else
                "off: it needs TCP; start with --tcp-port PORT (0: any free port) or set [service] tcp_port")
        self.log.info("service ready", home=str(self.home), socket=str(self.paths.socket), tcp_port=bound,
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
        info = {"pid": os.getpid(), "socket": str(self.paths.socket), "tcp_port": bound, "host": "127.0.0.1",
                "hostname": socket.gethostname(), "home": str(self.home), "started": self.started, "role": role}
        tmp = self.paths.info.with_suffix(".tmp")
        tmp.write_text(json.dumps(info) + "\n")
        tmp.replace(self.paths.info)
        return info


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


async def _accept(listener: Listener[Any], api: Any, via: str, tg: TaskGroup, max_body: int) -> None:
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


