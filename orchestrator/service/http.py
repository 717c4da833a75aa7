"""A small HTTP/1.1 server on anyio streams, with h11 doing the protocol.

Why not a framework server: the service needs things they hide. It must
create its Unix socket itself (mode 0600, in a 0700 directory) and check
each peer's uid with ``SO_PEERCRED``; it must run inside the service's own
anyio task group and stop when the service says so, without installing
signal handlers of its own; and it streams status changes for as long as a
client listens. With h11 (the protocol, correct and well kept) the rest is a
short loop per connection.
"""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import ssl
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import h11
from anyio.abc import ByteStream, Listener, SocketAttribute, SocketListener, SocketStream, TaskGroup
from anyio.streams.tls import TLSStream

from ..plugin.logs import get_logger
from .unixstream import over_transport

log = get_logger(component="http")

#: Largest request body accepted unless ``[service] max_request_bytes`` says otherwise (a job definition is
#: small; a 100k-value splitter is a few MiB).
MAX_BODY = 16 * 1024 * 1024
_KNOWN = frozenset(s.value for s in HTTPStatus)
#: Seconds an idle keep-alive connection is kept (``[service] idle_timeout``).
IDLE_TIMEOUT = 60.0


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    #: ``"unix"`` or ``"tcp"``: the listener it came through.
    via: str
    #: The peer's uid on the Unix socket (``SO_PEERCRED``), else ``None``.
    peer_uid: int | None = None

    def json(self) -> Any:
        return json.loads(self.body) if self.body else {}


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "application/json"
    headers: list[tuple[str, str]] = field(default_factory=list)
    #: A body sent as it is produced (chunked), e.g. server-sent events.
    stream: AsyncIterator[bytes] | None = None

    @classmethod
    def json(cls, value: Any, status: int = 200) -> Response:
        return cls(status, json.dumps(value, separators=(",", ":")).encode())


Handler = Callable[[Request], Awaitable[Response]]
#: Who may send a body at all, asked of a request's head (its body empty) before its body is read: the answer
#: that turns the caller away, or ``None``. A client the service does not admit held 16 MiB of its memory a
#: connection, 128 connections, before it was told no.
Screen = Callable[[Request], Response | None]


def peer_uid(stream: ByteStream) -> int | None:
    """The uid of the process at the other end of a Unix socket."""
    sock = stream.extra(SocketAttribute.raw_socket, None)
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return int(uid)


class Slot:
    """One open connection as the :class:`Gate` counts it; ``busy`` while a request is being answered."""

    def __init__(self, peer: Hashable) -> None:
        self.peer = peer
        self.busy = False
        self.scope = anyio.CancelScope()


class Gate:
    """Caps on open connections: ``total`` in all, ``per_peer`` for one peer (a uid on the Unix socket, an
    address on TCP). At a cap, the oldest idle connection (one not answering a request) of the peer that holds
    the most is closed to make room; a connection finds no room only when every one of those is busy."""

    def __init__(self, total: int, per_peer: int) -> None:
        self.total = total
        self.per_peer = per_peer
        self.peers: dict[Hashable, list[Slot]] = {}
        self.count = 0

    def admit(self, peer: Hashable) -> Slot | None:
        own = self.peers.get(peer, [])
        if len(own) >= self.per_peer:
            if not self._evict(own):
                return None
        elif self.count >= self.total and not any(
                self._evict(slots) for slots in sorted(self.peers.values(), key=len, reverse=True)):
            return None
        slot = Slot(peer)
        self.peers.setdefault(peer, []).append(slot)
        self.count += 1
        return slot

    def release(self, slot: Slot) -> None:
        slots = self.peers.get(slot.peer, [])
        if slot in slots:
            slots.remove(slot)
            self.count -= 1
            if not slots:
                del self.peers[slot.peer]

    def _evict(self, slots: list[Slot]) -> bool:
        for slot in slots:
            if not slot.busy:
                self.release(slot)
                slot.scope.cancel()
                return True
        return False


#: Descriptors kept for the service's own files, databases and child processes when connections are capped to
#: fit ``RLIMIT_NOFILE`` (at least this many, or a quarter of the limit).
FD_RESERVE = 64
#: Seconds the accept loop waits when the process has no descriptor left (EMFILE), before it tries again.
ACCEPT_BACKOFF = 0.1


def raise_nofile() -> int:
    """``RLIMIT_NOFILE``'s soft limit raised to its hard limit; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass(frozen=True)
class Limits:
    """The ``[service]`` limits of the HTTP server (docs/reference.md, "Service limits")."""

    max_body: int = MAX_BODY
    max_connections: int = 1024
    max_per_peer: int = 128
    #: Seconds a client has to send a request's head once it began (or once it connected).
    header_timeout: float = 10.0
    #: Seconds a keep-alive connection may wait for its next request; also the most one send may take.
    idle_timeout: float = IDLE_TIMEOUT

    def fitted(self, nofile: int) -> Limits:
        """These limits with ``max_connections`` lowered to fit ``nofile`` descriptors (with a reserve)."""
        room = max(8, nofile - max(FD_RESERVE, nofile // 4))
        total = min(self.max_connections, room)
        return replace(self, max_connections=total, max_per_peer=min(self.max_per_peer, total))


class Server:
    """The listeners' accept loops and the connections, with the caps of :class:`Limits`."""

    def __init__(self, handler: Handler, limits: Limits, screen: Screen | None = None) -> None:
        self.handler = handler
        self.limits = limits
        self.screen = screen
        self.gate = Gate(limits.max_connections, limits.max_per_peer)
        self._warned = 0.0

    async def serve(self, listener: Listener[Any], via: str, tg: TaskGroup, tls: ssl.SSLContext | None = None,
                    handshake_timeout: float = 10.0) -> None:
        """Accept until cancelled. Out of descriptors (EMFILE, ENFILE), it waits a little and tries again: the
        listener stays open, whatever the clients do. ``tls``: each connection's TLS handshake comes first (HTTPS),
        within ``handshake_timeout``."""
        assert isinstance(listener, SocketListener), listener
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except anyio.ClosedResourceError:
                    return
                except (OSError, anyio.BrokenResourceError) as exc:
                    self._warn(exc)
                    await anyio.sleep(ACCEPT_BACKOFF)
                    continue
                tg.start_soon(self._connection, stream, via, tls, handshake_timeout)

    def _warn(self, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._warned >= 10.0:  # once per 10 s at most: a flood must not flood the log too
            self._warned = now
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            log.warning("cannot accept a connection; trying again", error=f"{type(cause).__name__}: {cause}",
                        open=self.gate.count)

    async def _connection(self, stream: ByteStream, via: str, tls: ssl.SSLContext | None = None,
                          handshake_timeout: float = 10.0) -> None:
        if via == "unix" and isinstance(stream, SocketStream):
            try:
                stream = await over_transport(stream)
            except OSError:  # the client went at once
                await anyio.aclose_forcefully(stream)
                return
        uid = peer_uid(stream) if via == "unix" else None
        peer: Hashable = ("uid", uid) if via == "unix" else ("address", _remote_host(stream))
        slot = self.gate.admit(peer)
        try:
            if slot is None:
                if tls is None:
                    with anyio.move_on_after(1.0):
                        await stream.send(BUSY)
                return
            if tls is not None:
                try:
                    with anyio.fail_after(handshake_timeout):
                        stream = await TLSStream.wrap(stream, server_side=True, ssl_context=tls,
                                                      standard_compatible=False)
                except (TimeoutError, ssl.SSLError, anyio.EndOfStream) as exc:  # a scanner, an untrusting client
                    log.info("TLS handshake failed", error=f"{type(exc).__name__}: {exc}")
                    return
            with slot.scope:
                await serve_connection(stream, self.handler, via, self.limits.max_body, limits=self.limits,
                                       slot=slot, screen=self.screen)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            if slot is not None:
                self.gate.release(slot)
            await anyio.aclose_forcefully(stream)


def _remote_host(stream: ByteStream) -> str:
    address = stream.extra(SocketAttribute.remote_address, None)
    return str(address[0]) if isinstance(address, tuple) else str(address)


_BUSY_BODY = (b'{"error":"busy","message":"too many connections: [service] max_connections or '
              b'max_connections_per_peer","fqid":null,"field":null}')
#: What a connection over a cap is told before it is closed (its request is never read).
BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
        b"retry-after: 1\r\ncontent-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


async def serve_connection(stream: ByteStream, handler: Handler, via: str, max_body: int = MAX_BODY, *,
                           limits: Limits | None = None, slot: Slot | None = None,
                           screen: Screen | None = None) -> None:
    """Answer requests on one connection until the client closes it (keep-alive)."""
    limits = limits or Limits(max_body=max_body)
    slot = slot or Slot(None)
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
    uid = peer_uid(stream) if via == "unix" else None
    first = True
    async with stream:
        while True:
            wait = limits.header_timeout if first else limits.idle_timeout
            request = await _read_request(conn, stream, via, uid, max_body, limits, wait, screen)
            if request is None:
                return
            first = False
            slot.busy = True
            try:
                response = await handler(request)
            except Exception as exc:  # a bug behind one request: logged with its trace, the service serves on
                log.exception("request failed", method=request.method, path=request.path)
                response = Response.json({"error": "internal", "message": f"{type(exc).__name__}: {exc}"}, 500)
            await _send(conn, stream, response, head=request.method == "HEAD", timeout=limits.idle_timeout)
            slot.busy = False
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return


async def _next_event(conn: h11.Connection, stream: ByteStream, wait: float, head: float | None = None) -> Any:
    """The next h11 event: data must come within ``wait`` seconds, and, once a first byte came, the rest of the
    event within ``head`` seconds of it (a request's head sent a byte at a time is cut off)."""
    deadline = time.monotonic() + wait
    started = False
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        with anyio.fail_after(max(0.0, deadline - time.monotonic())):
            try:
                data = await stream.receive(65536)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                data = b""
        if head is None:
            deadline = time.monotonic() + wait
        elif data and not started:
            started = True
            deadline = min(deadline, time.monotonic() + head)
        conn.receive_data(data)


async def _read_request(conn: h11.Connection, stream: ByteStream, via: str, uid: int | None,
                        max_body: int, limits: Limits, wait: float, screen: Screen | None = None) -> Request | None:
    try:
        event = await _next_event(conn, stream, wait, limits.header_timeout)
        if not isinstance(event, h11.Request):
            return None
        declared = next((v for k, v in event.headers if k.lower() == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > max_body:
            # Refused before a byte of the body is read: the answer, then the connection closes.
            raise h11.RemoteProtocolError(f"request body of {int(declared)} bytes is over the limit of {max_body} "
                                          f"([service] max_request_bytes)", 413)
        chunked = any(k.lower() == b"transfer-encoding" for k, _ in event.headers)
        if screen is not None and (chunked or (declared is not None and declared != b"0")):
            refused = screen(_request(event, b"", via, uid))
            if refused is not None:  # told from its head: its body is never kept, the connection closes
                closing = replace(refused, headers=[*refused.headers, ("connection", "close")])  # (not kept alive)
                await _send(conn, stream, closing, head=False, timeout=limits.idle_timeout)
                await _discard_body(conn, stream, limits, max_body)
                return None
        body = bytearray()
        while True:
            part = await _next_event(conn, stream, limits.idle_timeout)
            if isinstance(part, h11.Data):
                body += part.data
                if len(body) > max_body:  # a chunked body has no length to check first
                    raise h11.RemoteProtocolError(f"request body over the limit of {max_body} bytes "
                                                  f"([service] max_request_bytes)", 413)
            elif isinstance(part, h11.EndOfMessage):
                break
            else:
                return None
    except TimeoutError:
        return None
    except h11.RemoteProtocolError as exc:
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            await _send(conn, stream, Response.json({"error": "bad request", "message": str(exc)},
                                                    exc.error_status_hint), head=False, timeout=limits.idle_timeout)
        return None
    return _request(event, bytes(body), via, uid)


async def _discard_body(conn: h11.Connection, stream: ByteStream, limits: Limits, most: int) -> None:
    """The rest of a refused request's body, read a part at a time and dropped (at most ``most`` bytes, each part
    within the idle timeout): a connection closed with data unread is reset, and a reset can cut the answer
    off before the client has read it."""
    seen = 0
    with contextlib.suppress(TimeoutError, h11.RemoteProtocolError, anyio.EndOfStream, anyio.BrokenResourceError):
        while seen <= most:
            part = await _next_event(conn, stream, limits.idle_timeout)
            if not isinstance(part, h11.Data):
                return
            seen += len(part.data)


def _request(event: h11.Request, body: bytes, via: str, uid: int | None) -> Request:
    target = urlsplit(event.target.decode("latin-1"))
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
    return Request(event.method.decode("ascii"), target.path, parse_qs(target.query), headers, body, via, uid)


#: On every answer: no page or answer of the service may be framed, nor its type guessed.
SAFE_HEADERS = [("x-frame-options", "DENY"), ("x-content-type-options", "nosniff"),
                ("referrer-policy", "no-referrer")]
#: The content security policy of an answer that names none (a page names its own).
DEFAULT_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"


async def _send(conn: h11.Connection, stream: ByteStream, response: Response, *, head: bool,
                timeout: float = IDLE_TIMEOUT) -> None:
    """Send ``response``; each write must be taken within ``timeout`` seconds (a client that reads nothing is
    dropped), the whole of a stream's body may take as long as it lasts."""
    headers = [("content-type", response.content_type), ("cache-control", "no-store"), *SAFE_HEADERS,
               *response.headers]
    if not any(k.lower() == "content-security-policy" for k, _ in response.headers):
        headers.append(("content-security-policy", DEFAULT_CSP))
    if response.stream is None:
        headers.append(("content-length", str(len(response.body))))

    async def write(data: bytes | None) -> None:
        if data:
            with anyio.fail_after(timeout):
                await stream.send(data)

    try:
        reason = HTTPStatus(response.status).phrase.encode() if response.status in _KNOWN else b""
        await write(conn.send(h11.Response(status_code=response.status, headers=headers, reason=reason)))
        if response.stream is not None:
            async for chunk in response.stream:
                await write(conn.send(h11.Data(data=chunk)))
        elif response.body and not head:
            await write(conn.send(h11.Data(data=response.body)))
        await write(conn.send(h11.EndOfMessage()))
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, TimeoutError):
        conn.send_failed()
