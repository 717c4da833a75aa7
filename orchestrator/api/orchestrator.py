"""``Orchestrator``: the entry point of the API, an async context manager, over either transport.

``async with Orchestrator(home=...) as orch:`` goes through the service that
holds the home if one does (the remote transport), and otherwise opens the
home here (the embedded transport: the runtime runs in this process, in a
task group of its own, until the block ends). Either way ``orch`` is the
same class with the same jobs, slices, statuses and errors. Leaving the
block writes every change; runs still going on at their backends keep
going and are found again by the next orchestrator on the home.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from ..core.errors import HomeLockedError, JobError, OrchestratorError, reraise_unwrapped
from ..plugin.logs import configure as configure_logs
from ..runtime.config import Config
from ..runtime.homelock import SERVICE_ROLE, HomeLock
from ..runtime.storage import Storage
from . import wire
from .job import Job
from .registry import JobRegistry
from .transport import Transport

if TYPE_CHECKING:
    from ..runtime.runtime import Runtime
    from .client import ServiceClient


def default_home() -> Path:
    return Path(os.environ.get("ORCHESTRATOR_HOME") or Path.home() / ".orchestrator")


class Orchestrator:
    """One orchestrator home, open for use.

    ``home`` defaults to ``$ORCHESTRATOR_HOME`` or ``~/.orchestrator``;
    ``config`` overrides settings of ``orchestrator.toml`` (same tables).
    ``service``: ``None`` goes through the service that holds the home if one
    does, else opens the home here; ``False`` always opens it here (refused
    while a service holds it); ``True`` requires a service. ``readonly``: read
    a home that another process (not a service) holds, without its lock: jobs,
    statuses and files as that process last wrote them; every request that
    would change something is refused, saying to share the home through
    ``orchestrator serve``.

    ``repository``: a PostgreSQL URL, instead of the home's ``[repository]
    url`` (``--repository`` on the command line). On a shared repository,
    when this home has no service of its own but the repository's active
    service answers on this machine, ``orch`` goes through that one.
    ``lock``: the home's lock, held already by this process (the service,
    which held it while it waited as a standby).

    ``url``: a service to reach over TCP instead of the home's socket (a
    client on another host): ``https://host:8750`` (default
    ``$ORCHESTRATOR_URL``), with ``token`` (default: the content of
    ``$ORCHESTRATOR_TOKEN_FILE``) and ``ca``, the PEM file of the CA that
    signed the service's certificate (default ``$ORCHESTRATOR_CA``, else the
    home's ``[service] tls_ca``, else the system's CAs). The certificate and
    its host name are always verified.
    """

    def __init__(self, home: str | os.PathLike[str] | None = None, config: dict[str, Any] | None = None, *,
                 role: str = "", service: bool | None = None, readonly: bool = False,
                 repository: str | None = None, lock: HomeLock | None = None, url: str | None = None,
                 token: str | None = None, ca: str | os.PathLike[str] | None = None) -> None:
        self.home = Path(home).expanduser().resolve() if home is not None else default_home()
        self._given = config
        self._overrides = config
        if repository is not None:
            self._overrides = {**(config or {}), "repository": {**(config or {}).get("repository", {}),
                                                                  "url": repository}}
        self._lock = lock
        self._role = SERVICE_ROLE if role == "service" else role
        self._service = service
        self._readonly = readonly
        self._url = url or os.environ.get("ORCHESTRATOR_URL") or None
        self._token, self._ca = token, ca
        self._stack: AsyncExitStack | None = None
        self._transport: Transport | None = None
        self._registry: JobRegistry | None = None
        self._runtime: Runtime | None = None

    # ------------------------------------------------------------ the API
    @property
    def jobs(self) -> JobRegistry:
        if self._registry is None:
            raise JobError("the orchestrator is not open (use 'async with Orchestrator(...)')")
        return self._registry

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            raise JobError("the orchestrator is not open (use 'async with Orchestrator(...)')")
        return self._transport

    @property
    def user(self) -> str:
        """Who this orchestrator acts as: the owner of the jobs it adds (:mod:`.owners`)."""
        return self.transport.caller.name

    @property
    def config(self) -> Config:
        if self._runtime is None:
            raise OrchestratorError("settings are the service's: this orchestrator works through it")
        return self._runtime.config

    @property
    def runtime(self) -> Runtime:
        """The runtime of an embedded orchestrator (the service hosts one); refused through a service."""
        if self._runtime is None:
            raise OrchestratorError(f"{self.home} is open through its service: this needs the home itself")
        return self._runtime

    @property
    def remote(self) -> bool:
        """True when this orchestrator works through a service."""
        return self._transport is not None and self._runtime is None

    async def events(self) -> AsyncGenerator[Any, None]:
        """From now on, every event and every status change, in order, each with its ``stimulus_id``."""
        async for item in self.transport.events():
            yield item

    async def refresh(self) -> None:
        """Ask every polled backend for news now, and apply it before returning."""
        await self.transport.handle(wire.RefreshRequest())
        if self._runtime is not None:
            with anyio.move_on_after(30):
                await self._runtime.settle()

    async def story(self, job: Job | int | str | tuple[int, ...]) -> list[dict[str, Any]]:
        """What happened to a job or subjob lately, and why: every event, status change, refusal and instruction
        of the recent steps (``[core] story_length``) that touched it, oldest first, each a dict of
        ``stimulus_id``, ``time``, ``kind`` (``event``, ``change``, ``refusal``, ``instruction``), ``type`` and
        ``description``. ``job``: a :class:`Job`, or whatever ``orch.jobs[...]`` takes (``3``, ``"3.1"``,
        ``(3, 1)``, a name). A subjob's story includes the requests naming its master and the batches it was
        in; a master's, its own entries (its subjobs' are theirs: ``orch.story("3.1")``)."""
        found: Job = job if isinstance(job, Job) else self.jobs[job]
        return list(await self.transport.handle(wire.StoryRequest(fqid=found.fqid)))

    async def metrics(self) -> dict[str, Any]:
        """Counters of the orchestrator and of each backend (``["backends"]["sim"]["driver"]["calls"]``...)."""
        return dict(await self.transport.handle(wire.MetricsRequest()))

    # ------------------------------------------------------------ life
    async def __aenter__(self) -> Orchestrator:
        if not structlog.is_configured():
            configure_logs()
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            transport = await self._through_service(stack)
            if transport is None:
                try:
                    transport = await self._open_here(stack)
                except HomeLockedError:
                    # a service took the home meanwhile (a watcher starting up): through it, once it answers
                    transport = await self._through_service(stack) if self._may_follow() else None
                    if transport is None:
                        raise
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._transport = stack, transport
        self._registry = JobRegistry(transport)
        return self

    async def _open_here(self, stack: AsyncExitStack) -> Transport:
        if not self._readonly:
            self.home.mkdir(parents=True, exist_ok=True)
        config = Config.load(self.home, self._overrides)
        from ..runtime.runtime import Runtime  # here: a client of a service never loads the runtime
        from .embedded import Embedded

        runtime = Runtime(self.home, config, role=self._role, readonly=self._readonly, lock=self._lock)
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        await runtime.open(tg)
        stack.push_async_callback(runtime.close)
        self._runtime = runtime
        return Embedded(runtime)

    async def _through_service(self, stack: AsyncExitStack) -> Transport | None:
        """The service's transport, when one holds the home and it is to be used (see ``service``)."""
        if self._service is False or self._role == SERVICE_ROLE:
            return None
        from .remote import connect_remote

        if self._url is not None:
            return await connect_remote(self.home, stack, required=True, client=await self._tcp_client())
        transport = await connect_remote(self.home, stack, required=False, relocate=self._find_service)
        if transport is None:
            leader = await self._active_service()
            if leader is not None:
                transport = await connect_remote(self.home, stack, required=False, client=leader,
                                                 relocate=self._find_service)
        if transport is None and self._service:
            from .client import ServiceUnavailable

            raise ServiceUnavailable(f"no orchestrator service holds {self.home} "
                                     f"(start one with 'orchestrator --home {self.home} serve')")
        if transport is not None and self._given:
            structlog.get_logger().warning("config overrides are ignored: the service's own settings apply",
                                           home=str(self.home))
        return transport

    async def _tcp_client(self) -> ServiceClient:
        """A client of the service at ``url``, verified and answering (a certificate that cannot be verified,
        or a wrong token, is refused here, at once and saying so)."""
        from .client import ServiceClient

        token = self._token
        if token is None and os.environ.get("ORCHESTRATOR_TOKEN_FILE"):
            token = Path(os.environ["ORCHESTRATOR_TOKEN_FILE"]).expanduser().read_text(encoding="utf-8").strip()
        ca = self._ca or os.environ.get("ORCHESTRATOR_CA") or None
        if ca is None and (self.home / "orchestrator.toml").exists():
            ca = Config.load(self.home).section("service").get("tls_ca") or None
        client = ServiceClient(url=self._url, token=token, ca=ca)
        try:
            async with client.twin() as probe:
                await probe.call("health")
        except BaseException:
            await client.aclose()
            raise
        return client

    async def _find_service(self) -> ServiceClient | None:
        """The service to talk to now: the home's own (a standby leads to the active one), else a shared
        repository's active service."""
        from .client import ServiceUnavailable, connect

        try:
            found = await connect(self.home, wait=2.0)
        except ServiceUnavailable:
            found = None
        return found if found is not None else await self._active_service()

    async def _active_service(self) -> ServiceClient | None:
        """On a shared repository: a client of its active service, when that one answers on this machine."""
        if self._readonly:
            return None
        storage = Storage.of(self.home, Config.load(self.home, self._overrides).section("repository"))
        if not storage.shared:
            return None
        from ..runtime.postgres.connect import read_lease
        from .client import follow

        view = await read_lease(storage.url)
        return await follow(view.address) if view is not None and not view.free else None

    def _may_follow(self) -> bool:
        """Whether a service now holds the home and this orchestrator may go through it."""
        if self._service is False or self._role == SERVICE_ROLE or self._readonly:
            return False
        from .client import service_holds

        return service_holds(self.home)

    def _left_active(self) -> bool:
        """Whether closing leaves jobs active on a home nobody else will watch (:mod:`.watcher`)."""
        runtime = self._runtime
        if runtime is None or self._readonly or self._role == SERVICE_ROLE or runtime.inbox.lost:
            return False
        from .watcher import autostart

        if not autostart(self.home, bool(runtime.config.section("service").get("autostart", True))):
            return False
        sm = runtime.sm
        return any(sm.active((job,)) for job in sm.job_ids())

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        watch = self._left_active()
        stack, self._stack = self._stack, None
        self._transport, self._registry, self._runtime = None, None, None
        if stack is None:
            return
        try:
            await stack.__aexit__(exc_type, exc, tb)
            if watch:
                from .watcher import start_watcher

                start_watcher(self.home, (self._overrides or {}).get("repository", {}).get("url"))
        except BaseExceptionGroup as group:  # the task group wraps the body's own exception: it goes on alone
            reraise_unwrapped(group, exc)


