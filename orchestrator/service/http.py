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

import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import h11
from anyio.abc import ByteStream, SocketAttribute

from ..plugin.logs import get_logger

log = get_logger(component="http")

#: Largest request body accepted unless ``[service] max_request_bytes`` says otherwise (a job definition is
#: small; a 100k-value splitter is a few MiB).
MAX_BODY = 16 * 1024 * 1024
_KNOWN = frozenset(s.value for s in HTTPStatus)
#: Seconds an idle keep-alive connection is kept.
IDLE_TIMEOUT = 120.0


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


def peer_uid(stream: ByteStream) -> int | None:
    """The uid of the process at the other end of a Unix socket."""
    sock = stream.extra(SocketAttribute.raw_socket, None)
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return int(uid)


async def serve_connection(stream: ByteStream, handler: Handler, via: str, max_body: int = MAX_BODY) -> None:
    """Answer requests on one connection until the client closes it (keep-alive)."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
    uid = peer_uid(stream) if via == "unix" else None
    async with stream:
        while True:
            request = await _read_request(conn, stream, via, uid, max_body)
            if request is None:
                return
            try:
                response = await handler(request)
            except Exception as exc:  # a bug behind one request: logged with its trace, the service serves on
                log.exception("request failed", method=request.method, path=request.path)
                response = Response.json({"error": "internal", "message": f"{type(exc).__name__}: {exc}"}, 500)
            await _send(conn, stream, response, head=request.method == "HEAD")
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return


async def _next_event(conn: h11.Connection, stream: ByteStream) -> Any:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        with anyio.fail_after(IDLE_TIMEOUT):
            try:
                data = await stream.receive(65536)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                data = b""
        conn.receive_data(data)


async def _read_request(conn: h11.Connection, stream: ByteStream, via: str, uid: int | None,
                        max_body: int = MAX_BODY) -> Request | None:
    try:
        event = await _next_event(conn, stream)
        if not isinstance(event, h11.Request):
            return None
        declared = next((v for k, v in event.headers if k.lower() == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > max_body:
            # Refused before a byte of the body is read: the answer, then the connection closes.
            raise h11.RemoteProtocolError(f"request body of {int(declared)} bytes is over the limit of {max_body} "
                                          f"([service] max_request_bytes)", 413)
        body = bytearray()
        while True:
            part = await _next_event(conn, stream)
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
                                                    exc.error_status_hint), head=False)
        return None
    target = urlsplit(event.target.decode("latin-1"))
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
    return Request(event.method.decode("ascii"), target.path, parse_qs(target.query), headers, bytes(body), via, uid)


async def _send(conn: h11.Connection, stream: ByteStream, response: Response, *, head: bool) -> None:
    headers = [("content-type", response.content_type), ("cache-control", "no-store"), *response.headers]
    if response.stream is None:
        headers.append(("content-length", str(len(response.body))))
    try:
        reason = HTTPStatus(response.status).phrase.encode() if response.status in _KNOWN else b""
        await stream.send(conn.send(h11.Response(status_code=response.status, headers=headers, reason=reason)) or b"")
        if response.stream is not None:
            async for chunk in response.stream:
                await stream.send(conn.send(h11.Data(data=chunk)) or b"")
        elif response.body and not head:
            await stream.send(conn.send(h11.Data(data=response.body)) or b"")
        await stream.send(conn.send(h11.EndOfMessage()) or b"")
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        conn.send_failed()
