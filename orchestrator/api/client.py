"""A client of the service's control API (httpx, over the Unix socket, or TCP with a token and, beyond
loopback, TLS: the service's certificate verified against a CA file or the system's CAs).

``ServiceClient.call(method, **arguments)`` calls one of the service's
control methods (the transport's operations, as JSON) and raises the same
errors the embedded API would: an unknown job is an
:class:`~orchestrator.core.errors.UnknownJobError`, a refused operation a
:class:`~orchestrator.core.errors.JobError` naming the job and the field,
another user's job a :class:`~orchestrator.core.errors.NotOwnerError`
naming its owner.
``events()`` follows the stream of every event and change, in order.
"""

from __future__ import annotations

import fcntl
import json
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import httpx

from ..core.errors import JobError, Lagging, NotOwnerError, OrchestratorError, UnknownJobError
from ..runtime.homelock import SERVICE_ROLE
from . import wire
from .owners import current_user
from .paths import ServicePaths
from .unixsocket import UnixTransport

_JSON = {"content-type": "application/json"}


class ServiceUnavailable(OrchestratorError):
    """No service answers on this home."""


class StandbyService(ServiceUnavailable):
    """The service asked is the standby of a pair; ``leader`` says where the active one answers (or ``None``)."""

    def __init__(self, message: str, leader: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.leader = leader


def tls_context(ca: str | os.PathLike[str] | None) -> ssl.SSLContext:
    """What a client trusts for an ``https://`` service: the CA file given, else the system's CAs. The
    certificate and the host name are always verified; there is no way to turn that off."""
    if ca is None:
        return ssl.create_default_context()
    path = Path(ca).expanduser()
    try:
        return ssl.create_default_context(cafile=os.fspath(path))
    except (OSError, ssl.SSLError) as exc:
        raise OrchestratorError(f"CA file {path}: cannot be read as PEM certificates: {exc}") from None


def _refused(where: str, exc: httpx.TransportError) -> ServiceUnavailable:
    """The error for a request that did not get through: a certificate that cannot be verified says so."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return ServiceUnavailable(
            f"the orchestrator service at {where} cannot be verified: {cause.verify_message or cause}; give the "
            f"PEM file of the CA that signed its certificate with --ca FILE, $ORCHESTRATOR_CA or [service] tls_ca")
    return ServiceUnavailable(f"the orchestrator service at {where} does not answer: {exc}")


class ServiceClient:
    """``ServiceClient(socket=...)`` on this machine, or ``ServiceClient(url=..., token=..., ca=...)`` over TCP
    (``https://`` verified against ``ca``, a PEM file of CA certificates, or else the system's CAs)."""

    def __init__(self, *, socket: str | os.PathLike[str] | None = None, url: str | None = None,
                 token: str | None = None, ca: str | os.PathLike[str] | None = None) -> None:
        if (socket is None) == (url is None):
            raise ValueError("give either socket= or url=")
        #: The Unix socket this client speaks on (``None``: TCP).
        self.socket = Path(socket) if socket is not None else None
        self.url, self.token, self.ca = url, token, ca
        headers = {"authorization": f"Bearer {token}"} if token else {}
        # plain HTTP on a Unix socket: no TLS, so no certificate store to load (verify=False; ~20 ms each)
        transport = UnixTransport(os.fspath(socket)) if socket is not None else None
        self.where = os.fspath(socket) if socket is not None else str(url)
        verify: ssl.SSLContext | bool = tls_context(ca) if str(url or "").startswith("https:") else False
        self._http = httpx.AsyncClient(transport=transport, base_url=url or "http://orchestrator", headers=headers,
                                       timeout=httpx.Timeout(None, connect=5.0), verify=verify)

    def twin(self) -> ServiceClient:
        """A new client of the same service (its own connections)."""
        return ServiceClient(socket=self.socket, url=self.url, token=self.token, ca=self.ca)

    def sync(self) -> SyncCaller:
        """Blocking calls on the same service (:class:`SyncCaller`)."""
        return SyncCaller(self.socket, url=self.url, token=self.token, ca=self.ca)

    @classmethod
    def for_home(cls, home: str | os.PathLike[str]) -> ServiceClient:
        return cls(socket=ServicePaths(Path(home)).socket)

    async def __aenter__(self) -> ServiceClient:
        await self._http.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._http.__aexit__(exc_type, exc, tb)

    async def aclose(self) -> None:
        """Close every connection now; reads under way end with an error (the client is not used again)."""
        await self._http.aclose()

    async def call(self, method: str, **kwargs: Any) -> Any:
        try:
            response = await self._http.post(f"/api/{method}", json=kwargs)
        except httpx.TransportError as exc:
            raise _refused(self.where, exc) from exc
        return _answer(response)

    async def send(self, request: wire.Request) -> Any:
        """Send a typed request (:mod:`.wire`) to its method; the answer as :meth:`call` gives it."""
        try:
            response = await self._http.post(f"/api/{wire.METHOD_OF[type(request)]}", content=wire.encode(request),
                                             headers=_JSON)
        except httpx.TransportError as exc:
            raise ServiceUnavailable(f"the orchestrator service at {self.where} does not answer: {exc}") from exc
        return _answer(response)

    def __getattr__(self, name: str) -> Any:
        """``await client.submit(fqid="3")`` is ``await client.call("submit", fqid="3")``."""
        if name.startswith("_"):
            raise AttributeError(name)

        async def method(**kwargs: Any) -> Any:
            return await self.call(name, **kwargs)

        return method

    async def events(self, opened: anyio.Event | None = None) -> AsyncIterator[dict[str, Any]]:
        """Each event and change, encoded (:mod:`orchestrator.core.codec`), with ``seq``: the number of
        the step that made it.

        ``opened`` is set once the service has subscribed this stream (its first
        line): no change after that is missed, so a snapshot read then is safe.
        """
        async with self._http.stream("GET", "/api/events") as response:
            if response.status_code != 200:
                raise OrchestratorError(f"service: {response.status_code} on /api/events")
            kind = "message"
            async for line in response.aiter_lines():
                if opened is not None:
                    opened.set()
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("data: "):
                    if kind == "lagging":  # the service dropped this stream: it fell too far behind
                        raise Lagging(json.loads(line[6:])["message"])
                    yield json.loads(line[6:])
                elif not line:
                    kind = "message"


class SyncCaller:
    """Blocking calls on the service's socket (the API's synchronous reads of details, as the embedded
    API reads SQLite), over one kept connection: a new client per call costs ~20 ms of TLS setup alone."""

    def __init__(self, socket: Path | None, timeout: float = 60.0, *, url: str | None = None,
                 token: str | None = None, ca: str | os.PathLike[str] | None = None) -> None:
        self.socket = socket
        self.timeout = timeout
        self.url, self.token, self.ca = url, token, ca
        self._http: httpx.Client | None = None

    def __call__(self, request: wire.Request) -> Any:
        if self._http is None:
            if self.socket is not None or self.url is None:
                # plain HTTP on a Unix socket: no TLS, so no certificate store to load (verify=False)
                self._http = httpx.Client(transport=httpx.HTTPTransport(uds=os.fspath(self.socket or ""), verify=False),
                                          base_url="http://orchestrator", timeout=self.timeout)
            else:
                self._http = httpx.Client(
                    base_url=self.url, timeout=self.timeout,
                    headers={"authorization": f"Bearer {self.token}"} if self.token else {},
                    verify=tls_context(self.ca) if self.url.startswith("https:") else False)
        try:
            response = self._http.post(f"/api/{wire.METHOD_OF[type(request)]}", content=wire.encode(request),
                                       headers=_JSON)
        except httpx.TransportError as exc:
            raise _refused(str(self.socket or self.url), exc) from exc
        return _answer(response)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None


def _answer(response: httpx.Response) -> Any:
    """The JSON value of a 200, else the error the embedded API would raise."""
    if response.status_code == 200:
        return response.json()
    try:
        error = response.json()
    except ValueError:
        error = {"message": response.text}
    message = str(error.get("message") or response.reason_phrase)
    if response.status_code == 400 and error.get("error") == "bad request":
        raise wire.BadRequest.answered(message, fqid=error.get("fqid"), field=error.get("field"))
    if response.status_code == 404 and error.get("error") == "unknown job":
        raise UnknownJobError(message, fqid=error.get("fqid"))
    if response.status_code == 403 and error.get("error") == "not owner":
        raise NotOwnerError(error.get("fqid"), owner=str(error.get("owner")), user=str(error.get("user")))
    if response.status_code == 409:
        raise _job_error(message, error.get("fqid"), error.get("field"))
    if response.status_code == 503 and error.get("error") == "standby":
        raise StandbyService(message, error.get("leader"))
    if response.status_code == 503:
        raise ServiceUnavailable(f"service: {message}")
    raise OrchestratorError(f"service: {response.status_code} {message}")


def _job_error(message: str, fqid: Any, field: Any) -> JobError:
    """Rebuild the service's JobError: same text, same ``fqid`` and ``field`` attributes."""
    error = JobError("", fqid=None)
    error.args = (message,)
    error.fqid, error.field = fqid, field
    return error


def service_holds(home: Path) -> bool:
    """Whether ``orchestrator serve`` holds this home's lock now (alive, perhaps still starting)."""
    path = home / "lock"
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except PermissionError:  # another user's home (its lock is theirs alone): a socket there stands for them
        return socket_there(home)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 200, 0).decode(errors="replace").startswith(SERVICE_ROLE)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def socket_there(home: Path) -> bool:
    """Whether the home's service socket exists; refused clearly when this user may not even look."""
    try:
        os.stat(ServicePaths(home).socket)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except PermissionError:
        raise OrchestratorError(
            f"user {current_user()} may not use {home}: its service lets in only its owner (and the users its "
            f"[service] users and admins settings name)") from None
    return True


async def connect(home: Path, *, wait: float = 30.0) -> ServiceClient | None:
    """A client (to open with ``async with``) of the service on ``home``, or ``None`` when no service holds it.

    A service that holds the home but does not answer yet (starting, or being
    restarted by supervisord) is waited for, up to ``wait`` seconds. The
    standby of a pair (a shared repository) answers with where the active
    service is: the client is then the active one's, once it answers (during
    a failover, the standby's own, when it has taken over).
    """
    if not service_holds(home) and not socket_there(home):
        return None
    seen: dict[str, Any] = {}
    with anyio.move_on_after(wait):
        while True:
            try:
                async with ServiceClient.for_home(home) as probe:
                    seen = await probe.call("health")
                if seen.get("role") != "standby":
                    return ServiceClient.for_home(home)
                leader = await follow(seen.get("leader"))
                if leader is not None:
                    return leader
            except ServiceUnavailable:
                if not service_holds(home):
                    return None
            await anyio.sleep(0.1)
    if seen.get("role") == "standby":
        raise StandbyService(f"the orchestrator service on {home} is a standby, and the active service "
                             f"({describe_address(seen.get('leader'))}) has not answered for {wait:g} s",
                             seen.get("leader"))
    raise ServiceUnavailable(f"the orchestrator service holds {home} but has not answered for {wait:g} s")


async def follow(address: Any) -> ServiceClient | None:
    """A client of the active service at ``address`` (what a lease or a standby publishes), if it answers
    here as the active one: its socket must be on this machine."""
    if not isinstance(address, dict) or not address.get("socket"):
        return None
    where = Path(str(address["socket"]))
    if not where.exists():
        return None
    try:
        async with ServiceClient(socket=where) as probe:
            health = await probe.call("health")
    except ServiceUnavailable:
        return None
    return ServiceClient(socket=where) if health.get("role") != "standby" else None


def describe_address(address: Any) -> str:
    """Where a service answers, for a message."""
    if not isinstance(address, dict):
        return "none yet"
    tcp = f", {address.get('host')}:{address['tcp_port']}" if address.get("tcp_port") is not None else ""
    return f"pid {address.get('pid')} on {address.get('hostname')}, socket {address.get('socket')}{tcp}"
