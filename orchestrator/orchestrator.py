"""``Orchestrator``: the embedded API's entry point, an async context manager.

``async with Orchestrator(home=...) as orch:`` locks the home, opens the
repository, restores every job and starts the monitoring loop in a task
group; leaving the block flushes every change and stops the loop. Jobs whose
runs are still going on at the backend keep going, and are found again by the
next orchestrator that opens the home.

While ``orchestrator serve`` holds the home, the home cannot be opened a
second time; ``async with`` then gives a
:class:`~orchestrator.service.remote.RemoteOrchestrator` instead, with the same
surface, working through the service (``service=`` chooses explicitly).
"""

from __future__ import annotations

import fnmatch
import os
import secrets
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import anyio
import structlog

from .config import Config
from .engine import Engine
from .errors import JobError
from .ids import parse_fqid
from .job import Job, JobSlice, _status_set
from .logs import configure as configure_logs
from .repository import SERVICE_ROLE, HomeLock, Repository
from .status import JobStatus

if TYPE_CHECKING:
    from .service.remote import RemoteOrchestrator


J = TypeVar("J")


def default_home() -> Path:
    return Path(os.environ.get("ORCHESTRATOR_HOME") or Path.home() / ".orchestrator")


class Lookups(Generic[J]):
    """``orch.jobs(key)``, ``.get(key)`` and ``key in orch.jobs``, all by ``[key]`` (embedded or remote)."""

    def __getitem__(self, key: Any) -> J:
        raise NotImplementedError

    def __call__(self, key: Any) -> J:
        return self[key]

    def get(self, key: Any, default: J | None = None) -> J | None:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: Any) -> bool:
        return self.get(key) is not None


class JobRegistry(Lookups[Job]):
    """``orch.jobs``: look jobs up, select them, add new ones."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def add(self, job: Job) -> Job:
        """Register ``job``; it gets the next integer id and status ``new``."""
        return await self._engine.ops.add(job)

    def __getitem__(self, key: Any) -> Job:
        try:
            fqid = parse_fqid(key)
        except ValueError as exc:
            raise KeyError(str(exc)) from None
        try:
            return self._engine.lookup(fqid)
        except (KeyError, IndexError):
            raise KeyError(f"no job {'.'.join(map(str, fqid))}") from None

    def __len__(self) -> int:
        return len(self._engine.jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter([self._engine.jobs[k] for k in sorted(self._engine.jobs)])

    def select(self, status: str | JobStatus | Sequence[str | JobStatus] | None = None,
               name: str | None = None) -> JobSlice:
        """Top-level jobs by status and name glob (``name="scan*"``)."""
        wanted = _status_set(status)
        return JobSlice([j for j in self if (wanted is None or j.status in wanted)
                         and (name is None or fnmatch.fnmatchcase(j.name, name))])

    def __repr__(self) -> str:
        return f"<{len(self)} jobs>"


class Orchestrator:
    """One orchestrator home, opened for use.

    ``home`` defaults to ``$ORCHESTRATOR_HOME`` or ``~/.orchestrator``;
    ``config`` overrides settings of ``orchestrator.toml`` (same tables).
    ``service``: ``None`` goes through the service that holds the home if one
    does (``async with`` then gives a ``RemoteOrchestrator``), else opens the
    home here; ``False`` always opens it here (refused while a service holds
    it); ``True`` requires a service.
    """

    def __init__(self, home: str | os.PathLike[str] | None = None, config: dict[str, Any] | None = None, *,
                 role: str = "", service: bool | None = None) -> None:
        self.home = Path(home).expanduser().resolve() if home is not None else default_home()
        self._overrides = config
        #: ``"service"`` when ``orchestrator serve`` holds the home (named to whoever else tries to open it).
        self._role = SERVICE_ROLE if role == "service" else role
        self._service = service
        self._stack: AsyncExitStack | None = None
        self._engine: Engine | None = None
        self._remote: RemoteOrchestrator | None = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            if self._remote is not None:
                raise JobError(f"{self.home} is open through its service: use the object 'async with "
                               "Orchestrator(...) as orch' gives (or pass service=False to open the home here)")
            raise JobError("the orchestrator is not open (use 'async with Orchestrator(...)')")
        return self._engine

    @property
    def jobs(self) -> JobRegistry:
        return JobRegistry(self.engine)

    @property
    def config(self) -> Config:
        return self.engine.config

    async def __aenter__(self) -> Orchestrator | RemoteOrchestrator:
        if not structlog.is_configured():
            configure_logs()
        remote = await self._through_service()
        if remote is not None:
            return remote
        self.home.mkdir(parents=True, exist_ok=True)
        config = Config.load(self.home, self._overrides)
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            lock = HomeLock(self.home / "lock", self._role)
            lock.acquire()
            stack.callback(lock.release)
            repo = Repository(self.home / "repository.sqlite")
            await repo.open()
            stack.push_async_callback(repo.close)
            engine = Engine(self.home, config, repo, _home_key(self.home))
            tg = anyio.create_task_group()
            await stack.enter_async_context(tg)
            stack.callback(tg.cancel_scope.cancel)
            stack.push_async_callback(engine.close)
            await engine.start(tg)
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._engine = stack, engine
        return self

    async def _through_service(self) -> RemoteOrchestrator | None:
        """The service's view of the home, opened, when it is to be used (see ``service``), else ``None``.

        The service itself (``role="service"``) never looks for one: it is the one.
        """
        if self._service is False or self._role == SERVICE_ROLE:
            return None
        from .service.client import ServiceUnavailable, connect
        from .service.remote import RemoteOrchestrator

        client = await connect(self.home)
        if client is None:
            if self._service:
                raise ServiceUnavailable(f"no orchestrator service holds {self.home} "
                                         f"(start one with 'orchestrator --home {self.home} serve')")
            return None
        if self._overrides:
            structlog.get_logger().warning("config overrides are ignored: the service's own settings apply",
                                           home=str(self.home))
        remote = RemoteOrchestrator(self.home, client)
        await remote.__aenter__()
        self._remote = remote
        return remote

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        remote, self._remote = self._remote, None
        if remote is not None:
            await remote.__aexit__(exc_type, exc, tb)
            return
        stack, self._stack = self._stack, None
        self._engine = None
        if stack is None:
            return
        try:
            await stack.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # The task group wraps the body's own exception: let the original through unwrapped.
            if exc is not None and _leaves(group) == [exc]:
                return
            leaves = _leaves(group)
            if len(leaves) == 1:
                raise leaves[0] from None
            raise


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        out += _leaves(e) if isinstance(e, BaseExceptionGroup) else [e]
    return out


def _home_key(home: Path) -> str:
    """A short id of this home, stable across runs, used in idempotency keys."""
    path = home / "home-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        key = secrets.token_hex(4)
        path.write_text(key + "\n")
        return key
