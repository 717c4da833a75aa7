"""The remote transport: the API through the service that holds a home.

Statuses are synchronous attributes, so the transport keeps a mirror: each
top-level job's record (name, definition, when added), its status, and for
a master its subjobs' status codes (one ``bytearray``: a master of a million
subjobs is one answer, never a million). The mirror is read once at
opening, follows the service's stream of events and changes, and is read
again for the jobs an operation touched before the operation returns.

Every snapshot says how many steps the service had handled when it was
read, and every streamed change the step that made it, so a change already
in a snapshot is never applied twice, and one that came while a read was
under way is applied after it: the transport keeps the last
:data:`RECENT_CHANGES` streamed changes, and a snapshot older than some of
them has them applied again on top (a subjob's change that came before the
mirror knew the split included).

Details that change with every run (``info``, a backend id, a subjob's
definition) are read when someone looks: a short blocking request on the
local socket, as the embedded transport reads SQLite.

The service answers each client with its own jobs only (every job for an
admin) and says who it takes the client to be (``caller``), so the mirror
holds only what this client may see.

On a shared repository the service may change under a long session (the
active service of a pair died, and the standby took over): when the event
stream breaks, ``relocate`` finds the service to talk to now, and the
transport follows it (the mirror is read again from it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from ..core import codec
from ..core.errors import OrchestratorError
from ..core.events import AddRequested, LinkedAdded, RemoveRequested, StatusChanged
from ..core.ids import FQID, parse_fqid
from ..core.statuses import ACTIVE, JobStatus
from ..plugin.logs import get_logger
from . import wire
from .client import ServiceClient, ServiceUnavailable, connect
from .owners import Caller, current_user
from .paths import ServicePaths
from .transport import JobRecord

log = get_logger(component="remote")
_FROM_DIGITS = bytes.maketrans(b"0123456789", bytes(range(10)))
OPEN_TIMEOUT = 30.0


#: Streamed status changes kept to be applied again over a snapshot read before them.
RECENT_CHANGES = 4096


@dataclass(slots=True)
class Mirror:
    record: JobRecord
    status: JobStatus
    codes: bytearray | None
    #: The service's step count when this job was last read: changes of later steps apply.
    step: int
    #: The step of the last change applied from the stream: a read taken before it is older than the mirror.
    applied: int = 0


class Remote:
    """See the module docstring."""

    def __init__(self, home: Path, client: ServiceClient,
                 relocate: Callable[[], Awaitable[ServiceClient | None]] | None = None) -> None:
        self.home = home
        self.client = client
        self._relocate = relocate
        #: The service's socket: the home's own, or the active service's of a pair.
        self.socket = client.socket or ServicePaths(home).socket
        #: Told by the service at the first read (a shared repository keeps it in its shared directory).
        self.workspace = home / "workspace"
        self._sync = client.sync()
        self._tops: dict[int, Mirror] = {}
        self._stale: set[int] = set()
        #: The last streamed status changes: (step, job, subjob indexes or ``None`` for the job, new status).
        self._recent: deque[tuple[int, int, Sequence[int] | None, JobStatus]] = deque()
        #: The step of the newest change no longer in :attr:`_recent`: a snapshot older than it is incomplete.
        self._forgotten = 0
        self._wake = anyio.Event()
        self._connected = anyio.Event()
        self._closing = False
        #: Who the service takes this client to be (its first answer says).
        self.caller = Caller(current_user())
        self._mirrored = Mirrored(self)

    async def _stop(self) -> None:
        """End the background readers by closing their connections, not by cancelling them mid-read.

        A read of a Unix socket cancelled just as data arrives makes anyio's reader callback set the
        result of a cancelled future, which asyncio reports as an ``InvalidStateError`` in a callback:
        closing the client wakes the reads with an error that the readers, seeing ``_closing``, end on.
        """
        self._closing = True
        self._sync.close()
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await self.client.aclose()

    async def open(self, stack: AsyncExitStack) -> None:
        await self.client.__aenter__()  # closed by _stop (the client may be another by then: relocated)
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        stack.push_async_callback(self._stop)
        tg.start_soon(self._follow)
        with anyio.move_on_after(OPEN_TIMEOUT):
            await self._connected.wait()
        if not self._connected.is_set():
            raise ServiceUnavailable(f"the orchestrator service on {self.home} did not open its event stream")
        await self._load(None)
        tg.start_soon(self._refresher)

    # ------------------------------------------------------------ the mirror
    async def _load(self, jobs: Sequence[int] | None) -> None:
        self._take(await self.client.send(wire.DescribeRequest(jobs=None if jobs is None else list(jobs))), jobs)

    def _fetch(self, job: int) -> None:
        """A job this mirror does not know yet (another client's): read on the spot."""
        self._take(self._sync(wire.DescribeRequest(jobs=[job])), [job])

    def _take(self, answer: dict[str, Any], jobs: Sequence[int] | None) -> None:
        step = int(answer["step"])
        if "caller" in answer:
            self.caller = Caller(str(answer["caller"]["name"]), bool(answer["caller"]["admin"]))
        if answer.get("workspace"):
            self.workspace = Path(answer["workspace"])
        seen = set()
        later: dict[int, list[tuple[int, Sequence[int] | None, JobStatus]]] = {}
        for seq, job, indexes, new in reversed(self._recent):  # the changes streamed since the read, in order
            if seq <= step:
                break
            later.setdefault(job, []).append((seq, indexes, new))
        for changes in later.values():
            changes.reverse()
        for r in answer["jobs"]:
            codes = bytearray(r["codes"].encode().translate(_FROM_DIGITS)) if r.get("codes") is not None else None
            record = JobRecord(r["id"], r["name"], r["spec"], r["added"], str(r.get("owner", "")))
            seen.add(r["id"])
            mine = self._tops.get(r["id"])
            if mine is not None and mine.applied > step and self._forgotten > step:
                # read before changes the stream brought, some no longer kept: the statuses held are the newer
                mine.record = record
                if codes is not None and (mine.codes is None or len(mine.codes) != len(codes)):
                    self._stale.add(r["id"])  # its subjobs changed in number meanwhile: read again
                continue
            fresh = self._tops[r["id"]] = Mirror(record, JobStatus(r["status"]), codes, step)
            for seq, indexes, new in later.get(r["id"], ()):  # applied again on top
                if not _change(fresh, seq, indexes, new):
                    self._stale.add(r["id"])
        gone = set(answer.get("gone", ())) if jobs is not None else set(self._tops) - seen
        for job in gone:
            self._tops.pop(int(job), None)
        if self._stale:
            self._wake.set()

    async def _follow(self) -> None:
        delay = 0.1
        while True:
            try:
                async for item in self.client.events(self._connected):
                    delay = 0.1
                    self._apply(item)
            except Exception as exc:  # a background task must not end the user's block: log, reconnect, re-read
                if self._closing:
                    return
                log.warning("event stream from the service ended; reconnecting", error=str(exc))
            self._connected = anyio.Event()
            self._stale.add(-1)
            self._wake.set()
            await anyio.sleep(delay)
            delay = min(delay * 2, 2.0)
            await self._relocated()

    async def _relocated(self) -> None:
        """After the stream broke: if another service answers for the home now (a failover), follow it."""
        if self._relocate is None or self._closing:
            return
        try:
            found = await self._relocate()
        except OrchestratorError:
            return
        if found is None or found.socket == self.socket:
            if found is not None:
                await found.aclose()
            return
        await found.__aenter__()
        old, self.client, self.socket = self.client, found, found.socket or self.socket
        self._sync.close()
        self._sync = found.sync()
        await old.aclose()
        log.info("following the active service", socket=str(self.socket))

    def _apply(self, item: dict[str, Any]) -> None:
        step = int(item.get("seq", 0))
        kind = item.get("type")
        if kind == "StatusChanged":
            event = codec.decode(item)
            assert isinstance(event, StatusChanged)
            runs = event.changed
            job = runs.job if not isinstance(runs, tuple) else runs[0][0]
            mirror = self._tops.get(job)
            if not isinstance(runs, tuple):
                self._recent.append((step, job, runs.indexes, event.new))
                if len(self._recent) > RECENT_CHANGES:
                    self._forgotten = self._recent.popleft()[0]
            if mirror is None:
                self._stale.add(job)
            elif (step > mirror.step and not isinstance(runs, tuple)
                  and not _change(mirror, step, runs.indexes, event.new)):
                self._stale.add(job)  # subjobs this mirror does not know yet (a split): read again
        elif kind in (AddRequested.__name__, RemoveRequested.__name__):
            for fq in item.get("targets", ()):
                self._stale.add(int(fq[0]))
        elif kind == LinkedAdded.__name__:
            self._stale.update((int(item["job"]), int(item["master"])))
        if self._stale:
            self._wake.set()

    async def _refresher(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            await anyio.sleep(0.02)
            await self._connected.wait()
            stale, self._stale = self._stale, set()
            try:
                with anyio.CancelScope(shield=True), anyio.move_on_after(30):  # see _stop: never cancelled mid-read
                    await self._load(None if -1 in stale else sorted(stale))
            except Exception as exc:  # retried, never raised into the user's block
                if self._closing:
                    return
                log.warning("could not re-read jobs from the service", error=f"{type(exc).__name__}: {exc}")
                self._stale |= stale
                await anyio.sleep(1.0)
                self._wake.set()

    # ------------------------------------------------------------ the transport
    async def handle(self, request: wire.Request) -> Any:
        """The request encoded and sent (:mod:`.wire`), the service's reply as it answered; the mirror of the jobs
        an operation touched is read again before this returns (an add's new job, every job after a refresh)."""
        touched = _touched(request)
        try:
            reply = await self.client.send(request)
        finally:
            if touched:
                await self._load(sorted(touched))
        if isinstance(request, wire.AddRequest):
            await self._load([int(reply["id"])])
        elif isinstance(request, wire.RefreshRequest):
            await self._load(None)
        return reply

    def read(self, request: wire.Request) -> Any:
        """A short blocking request on the local socket (``job.info`` is an attribute)."""
        return self._sync(request)

    def statuses(self) -> Mirrored:
        return self._mirrored

    async def events(self) -> AsyncIterator[Any]:
        async with self.client.twin() as client:
            async for item in client.events():
                if "type" in item:
                    yield codec.decode(item)


class Mirrored:
    """The statuses as the mirror holds them (:class:`~.transport.Statuses`); a job it does not know yet (another
    client's) is read on the spot."""

    def __init__(self, remote: Remote) -> None:
        self._remote = remote
        self._tops = remote._tops

    def job_ids(self) -> list[int]:
        return sorted(self._tops)

    def record(self, job: int) -> JobRecord:
        return self._tops[job].record

    def owner(self, job: int) -> str | None:
        mirror = self._tops.get(job)
        if mirror is not None:
            return mirror.record.owner
        return self._remote.read(wire.OwnerRequest(job=job))["owner"]  # type: ignore[no-any-return]

    def exists(self, fq: FQID) -> bool:
        if fq[0] not in self._tops and fq[0] >= 0:
            self._remote._fetch(fq[0])
        mirror = self._tops.get(fq[0])
        if mirror is None or len(fq) > 2:
            return False
        return len(fq) == 1 or (mirror.codes is not None and 0 <= fq[1] < len(mirror.codes))

    def status(self, fq: FQID) -> JobStatus:
        mirror = self._tops[fq[0]]
        if len(fq) == 1:
            return mirror.status
        assert mirror.codes is not None
        return JobStatus.from_code(mirror.codes[fq[1]])

    def n_subjobs(self, job: int) -> int:
        mirror = self._tops.get(job)
        return len(mirror.codes) if mirror is not None and mirror.codes is not None else 0

    def counts(self, job: int) -> dict[JobStatus, int]:
        codes = self._tops[job].codes
        if codes is None:
            return {}
        return {s: n for s in JobStatus if (n := codes.count(s.code))}

    def indexes(self, job: int, statuses: Sequence[JobStatus]) -> list[int]:
        codes = self._tops[job].codes
        wanted = {s.code for s in statuses}
        return [i for i, c in enumerate(codes or ()) if c in wanted]

    def active(self, fq: FQID) -> bool:
        return self.exists(fq) and self.status(fq) in ACTIVE


#: Operations after which the mirror of the jobs they name is read again.
def _touched(request: wire.Request) -> set[int]:
    """The top-level jobs an operation names (none for a read)."""
    if not isinstance(request, wire.OPERATIONS):
        return set()
    return {fq[0] for fq in wire.fqs(request.targets)} | ({parse_fqid(request.fqid)[0]} if request.fqid else set())


async def connect_remote(home: Path, stack: AsyncExitStack, *, required: bool, client: ServiceClient | None = None,
                         relocate: Callable[[], Awaitable[ServiceClient | None]] | None = None) -> Remote | None:
    """The transport through the service on ``home`` (or ``client``'s), or ``None`` when no service holds it;
    ``relocate`` finds the service to follow when the stream breaks (see the module docstring)."""
    client = client or await connect(home)
    if client is None:
        if required:
            raise ServiceUnavailable(f"no orchestrator service holds {home} "
                                     f"(start one with 'orchestrator --home {home} serve')")
        return None
    remote = Remote(home, client, relocate)
    try:
        await remote.open(stack)
    except OrchestratorError:
        raise
    return remote


def _change(mirror: Mirror, step: int, indexes: Sequence[int] | None, new: JobStatus) -> bool:
    """A streamed change applied to a job's mirror; ``False``: it names subjobs the mirror does not know yet."""
    mirror.applied = max(mirror.applied, step)
    if indexes is None:
        mirror.status = new
        return True
    if mirror.codes is None or max(indexes, default=-1) >= len(mirror.codes):
        return False
    for i in indexes:
        mirror.codes[i] = new.code
    return True
