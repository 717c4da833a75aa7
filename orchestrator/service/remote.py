"""``RemoteOrchestrator``: the embedded API's objects, backed by the service that holds the home.

While ``orchestrator serve`` holds a home, ``async with Orchestrator(home)``
hands back one of these: ``orch.jobs``, jobs, subjob lists and slices behave
as the embedded ones do (same lookups, same identity, same errors), and every
operation is a request to the service.

What is kept here, and why:

- Statuses are synchronous attributes, so they are cached: each top-level
  job's status and, for a master, its subjobs' statuses as one ``bytearray``
  of codes (one request per master, never one per subjob). A background task
  in this object's task group follows the service's stream of status changes
  and applies them; after every operation the jobs it touched are read again.
- A read and the event stream travel on different connections, so a read is
  stamped with the service's time (``Control.describe``): an event stamped
  before a job's last read is already in it and is skipped, and the events
  that arrived while a read was under way are applied again after it. Each
  event sets a status (it does not step one), so replaying them in order is
  safe, and the cache ends where the service is.
- Details (``info``, ``backend_id``, ``backend``...) change with every status
  change, so an event or an operation only marks them stale; they are read
  again when someone looks, in bulk (a page of a master's subjobs per
  request). A property cannot await, so that read is a short blocking request
  on the local socket, as the embedded API reads a subjob from SQLite when it
  is first touched. ``await job.refresh()`` reads ahead without blocking.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import anyio
import httpx

from ..control import UnknownJobError
from ..errors import JobError, OrchestratorError
from ..ids import FQID, parse_fqid, parse_fqid_or_none
from ..job import Job, _status_set
from ..logs import get_logger
from ..orchestrator import Lookups
from ..status import JobStatus
from .client import ServiceClient, ServiceUnavailable
from .paths import ServicePaths
from .remote_job import PAGE, Record, RemoteJob, RemoteSlice

log = get_logger(component="remote")

#: Status digits as a service sends them ("0".."9") to the codes ``JobStatus.from_code`` takes.
_FROM_DIGITS = bytes.maketrans(b"0123456789", bytes(range(10)))
#: Seconds to wait for the service's event stream when opening.
OPEN_TIMEOUT = 30.0
#: Seconds a background re-read waits, so that an operation's own re-read usually makes it unnecessary.
DEBOUNCE = 0.05
#: Seconds a blocking read of details may take.
READ_TIMEOUT = 60.0


class RemoteOrchestrator:
    """The public surface of :class:`~orchestrator.Orchestrator`, through the service on ``home``'s socket.

    ``Orchestrator(home)`` returns one from ``async with`` when a service holds
    the home; it can also be opened directly: ``async with RemoteOrchestrator(home) as orch``.
    """

    def __init__(self, home: str | os.PathLike[str], client: ServiceClient | None = None) -> None:
        self.home = Path(home).expanduser().resolve()
        self.client = client if client is not None else ServiceClient.for_home(self.home)
        self._tops: dict[int, RemoteJob] = {}
        self._registry = RemoteRegistry(self)
        # Events received while reads are under way, replayed after each read (see the module docstring).
        self._log: list[dict[str, Any]] = []
        self._log_base = 0
        self._inflight = 0
        #: Top-level jobs whose subjobs changed in ways the cache cannot follow: id -> time of that event.
        self._stale: dict[int, float] = {}
        self._want_all = False
        self._wake = anyio.Event()
        self._connected = anyio.Event()
        self._stream_error: BaseException | None = None
        self._sync: httpx.Client | None = None
        self._same_process = False
        self._stack: AsyncExitStack | None = None

    @property
    def jobs(self) -> RemoteRegistry:
        return self._registry

    @property
    def engine(self) -> NoReturn:
        """Code that needs the engine itself (``Workflows(orch)``...) gets a clear refusal, not an AttributeError."""
        raise OrchestratorError(f"{self.home} is held by the orchestrator service: this needs the home itself, "
                                "so it runs in the service (workflows do), or after the service stops")

    # ------------------------------------------------------------ life
    async def __aenter__(self) -> RemoteOrchestrator:
        info = ServicePaths(self.home).read_info() or {}
        # A service in this very process cannot answer while a blocking read holds the loop.
        self._same_process = info.get("pid") == os.getpid()
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            await stack.enter_async_context(self.client)
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            tg.start_soon(self._follow)
            with anyio.move_on_after(OPEN_TIMEOUT):
                await self._connected.wait()
            if not self._connected.is_set():
                raise ServiceUnavailable(f"the orchestrator service on {self.home} did not open its event stream "
                                         f"within {OPEN_TIMEOUT:g} s ({self._stream_error or 'no answer'})")
            await self._load(None)
            tg.start_soon(self._refresher)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        """Stop following the service and close the connections; the body's exception goes through as it is."""
        stack, self._stack = self._stack, None
        if self._sync is not None:
            self._sync.close()
            self._sync = None
        if stack is not None:
            await stack.aclose()  # the background tasks never raise: nothing to merge with the body's exception

    async def refresh(self) -> None:
        """Read every top-level job again (jobs another client added or removed included)."""
        await self._load(None)

    def __repr__(self) -> str:
        return f"<RemoteOrchestrator {self.home} via {self.client.where}>"

    # ------------------------------------------------------------ following the service
    async def _follow(self) -> None:
        """Apply the service's status changes as they come; after a break, read everything again."""
        delay = 0.1
        while True:
            try:
                async for batch in self.client.events(self._connected):
                    delay = 0.1
                    self._receive(batch)
            except Exception as exc:  # a background task must not end the user's block: log, reconnect, re-read
                self._stream_error = exc
            if self._connected.is_set():
                log.warning("event stream from the service ended; reconnecting", error=str(self._stream_error))
                self._connected = anyio.Event()
                self._want_all = True
                self._wake.set()
            await anyio.sleep(delay)
            delay = min(delay * 2, 2.0)

    async def _refresher(self) -> None:
        """Re-read what events said the cache cannot follow (new jobs, new subjobs, a missed stretch)."""
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            await anyio.sleep(DEBOUNCE)
            await self._connected.wait()
            try:
                if self._want_all:
                    self._want_all = False
                    await self._load(None)
                stale = [str(t) for t in self._stale if t in self._tops]
                self._stale.clear()
                if stale:
                    await self._load(stale)
            except Exception as exc:  # as in _follow: retried, never raised into the user's block
                log.warning("could not re-read jobs from the service", error=f"{type(exc).__name__}: {exc}")
                self._want_all = True
                await anyio.sleep(1.0)
                self._wake.set()

    def _receive(self, batch: dict[str, Any]) -> None:
        """One batch from the event stream: applied now, and kept for replay while a read is under way."""
        if self._inflight:
            self._log.append(batch)
        self._apply_event(batch)

    def _apply_event(self, batch: dict[str, Any]) -> None:
        t = float(batch.get("time", 0.0))
        for fqid, _old, new in batch.get("changes", ()):
            fq = parse_fqid_or_none(fqid)
            if fq is None:
                continue
            top = self._tops.get(fq[0])
            if top is None:  # a job added by someone else: read the list again
                self._want_all = True
                self._wake.set()
                continue
            if t < top._snap:  # already in the last read of this job
                continue
            try:
                status = JobStatus(new)
            except ValueError:
                continue
            if top._rec is not None:
                top._rec.stale = True
            if len(fq) == 1:
                top._status = status
            elif len(fq) == 2 and fq[1] < len(top._codes):
                top._codes[fq[1]] = status.code
                sub = top._subrecs.get(fq[1])
                if sub is not None:
                    sub.stale = True
            else:  # subjobs this cache does not know yet (made by another client's submit)
                self._stale.setdefault(fq[0], t)
                self._wake.set()

    # ------------------------------------------------------------ reading
    async def _load(self, fqids: Sequence[str] | None) -> None:
        """Read ``fqids`` (``None``: every top-level job) and apply it, then the events that came meanwhile."""
        mark = self._log_base + len(self._log)
        self._inflight += 1
        try:
            try:
                result = await self.client.describe(fqids=None if fqids is None else list(fqids))
            except UnknownJobError:
                if fqids is None:
                    raise
                result = await self.client.describe(fqids=None)  # one of them went: read the whole list
                fqids = None
            self._apply_records(result, listing=fqids is None)
            for batch in self._log[mark - self._log_base:]:
                self._apply_event(batch)
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._log_base += len(self._log)
                self._log.clear()

    def _load_now(self, fqids: Sequence[str], who: str) -> None:
        """A blocking read, for a property that cannot await (see the module docstring)."""
        if not fqids:
            return
        if self._same_process:
            raise JobError("this is not read yet and the service runs in this process, so it cannot be read "
                           "without awaiting: 'await job.refresh()' first", fqid=who)
        if self._sync is None:
            transport = httpx.HTTPTransport(uds=os.fspath(ServicePaths(self.home).socket))
            self._sync = httpx.Client(transport=transport, base_url="http://orchestrator",
                                      timeout=httpx.Timeout(READ_TIMEOUT, connect=5.0))
        try:
            response = self._sync.post("/api/describe", json={"fqids": list(fqids)})
        except httpx.TransportError as exc:
            raise ServiceUnavailable(f"the orchestrator service on {self.home} does not answer: {exc}") from exc
        if response.status_code == 200:
            self._apply_records(response.json(), listing=False)
            return
        try:
            message = str(response.json().get("message"))
        except ValueError:
            message = response.text
        if response.status_code == 404:
            raise UnknownJobError(message)
        raise OrchestratorError(f"service: {response.status_code} {message}")

    def _apply_records(self, result: dict[str, Any], *, listing: bool) -> None:
        t = float(result["time"])
        seen: set[int] = set()
        for data in result["jobs"]:
            fq = parse_fqid(data["fqid"])
            seen.add(fq[0])
            top = self._tops.get(fq[0])
            if len(fq) == 1:
                if top is None:
                    top = self._tops[fq[0]] = RemoteJob(self, fq, None)
                if t < top._snap:
                    continue  # an older read than the one this job has
                top._snap = t
                top._status = JobStatus(data["status"])
                top._set_codes(bytearray(str(data.get("codes", "")).encode().translate(_FROM_DIGITS)))
                top._rec = Record(data, t)
                if self._stale.get(fq[0], float("inf")) <= t:
                    del self._stale[fq[0]]
            elif len(fq) == 2 and top is not None:
                old = top._subrecs.get(fq[1])
                if old is None or old.time <= t:
                    top._subrecs[fq[1]] = Record(data, t)
        if listing:
            for gone in [i for i, top in self._tops.items() if i not in seen and top._snap < t]:
                self._forget(self._tops[gone])

    def _forget(self, top: RemoteJob) -> None:
        top._removed = True
        if self._tops.get(top.id) is top:
            del self._tops[top.id]
        self._stale.pop(top.id, None)

    def _top(self, job_id: int) -> RemoteJob:
        """A top-level job, read from the service if this cache has not seen it (another client added it)."""
        top = self._tops.get(job_id)
        if top is None:
            try:
                self._load_now([str(job_id)], str(job_id))
            except UnknownJobError:
                raise KeyError(f"no job {job_id}") from None
            top = self._tops[job_id]
        return top

    def _details(self, job: RemoteJob, *, fresh: bool) -> Record:
        """``job``'s details, read (in bulk with its neighbours) when missing or, for ``fresh``, stale."""
        rec = job._record()
        if rec is not None and not (fresh and rec.stale):
            return rec
        job._check()
        if job.parent is None:
            self._load_now([job.fqid], job.fqid)
        else:
            master = job.parent
            n = len(master._codes)
            start = job.id - job.id % PAGE

            def needs(i: int) -> bool:
                r = master._subrecs.get(i)
                return r is None or (fresh and r.stale)

            self._load_now([f"{master.id}.{i}" for i in range(start, min(n, start + PAGE)) if needs(i)], job.fqid)
        rec = job._record()
        if rec is None:
            raise JobError("is gone from the service", fqid=job.fqid)
        return rec

    def _names(self, master: RemoteJob, indexes: Sequence[int]) -> None:
        """Make sure the subjobs at ``indexes`` have their (unchanging) details, in one read."""
        missing = [i for i in indexes if i not in master._subrecs]
        if missing:
            self._load_now([f"{master.id}.{i}" for i in missing], master.fqid)

    # ------------------------------------------------------------ operating
    async def _operate(self, jobs: Sequence[RemoteJob], method: str, /, *, reread: bool = True,
                       **kwargs: Any) -> Any:
        """Call ``method`` on the service, then read again the top-level jobs it touched (even when refused:
        a partial submission or a collective operation that stopped has still changed some)."""
        for job in jobs:
            job._check()
        tops = list({id(t): t for t in (j._top_job() for j in jobs)}.values())
        try:
            result = await self.client.call(method, **kwargs)
        except JobError as exc:
            if not isinstance(exc, UnknownJobError):
                await self._after(tops)
            raise
        if reread:
            await self._after(tops)
        return result

    async def _after(self, tops: Sequence[RemoteJob]) -> None:
        for top in tops:
            for rec in top._subrecs.values():
                rec.stale = True
        live = [t.fqid for t in tops if not t._removed]
        if live:
            await self._load(live)


class RemoteRegistry(Lookups[RemoteJob]):
    """``orch.jobs`` through the service: look jobs up, select them, add new ones."""

    def __init__(self, orch: RemoteOrchestrator) -> None:
        self._orch = orch

    async def add(self, job: Job) -> RemoteJob:
        """Register ``job`` with the service; it gets the next integer id. Returns the service's job."""
        if not isinstance(job, Job):
            raise JobError(f"orch.jobs.add() takes a Job(...), not {type(job).__name__}", fqid="(new)")
        if job._engine is not None or job.parent is not None:
            raise JobError("is already registered", fqid=job.fqid_or_new)
        added = await self._orch.client.add(name=job.name, spec=job.spec())
        await self._orch._load([added["fqid"]])
        return self._orch._tops[parse_fqid(added["fqid"])[0]]

    def __getitem__(self, key: Any) -> RemoteJob:
        try:
            fq: FQID = parse_fqid(key)
        except ValueError as exc:
            raise KeyError(str(exc)) from None
        job = self._orch._top(fq[0])
        try:
            for part in fq[1:]:
                job = job.subjobs(part)
        except IndexError:
            raise KeyError(f"no job {'.'.join(map(str, fq))}") from None
        return job

    def __len__(self) -> int:
        return len(self._orch._tops)

    def __iter__(self) -> Iterator[RemoteJob]:
        tops = self._orch._tops
        return iter([tops[k] for k in sorted(tops)])

    def select(self, status: Any = None, name: str | None = None) -> RemoteSlice:
        """Top-level jobs by status and name glob (``name="scan*"``)."""
        wanted = _status_set(status)
        return RemoteSlice([j for j in self if (wanted is None or j.status in wanted)
                            and (name is None or fnmatch.fnmatchcase(j.name, name))])

    def __repr__(self) -> str:
        return f"<{len(self)} jobs>"
