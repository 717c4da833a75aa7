"""A client's connection on the service's Unix socket, read through asyncio's socket transports.

Why not anyio's ``UNIXSocketStream`` as accepted: on asyncio it waits for a
readable socket with a future that a selector callback resolves. When the
task reading it is cancelled in the same turn of the loop as data arrives
(the service stopping while a client sends, an idle connection cut off as
its next request comes), the callback then sets a result on a cancelled
future and the loop reports ``InvalidStateError: invalid state`` with a
traceback on the service's stderr. asyncio's transports check for that, as
anyio's TCP streams (which use them) do too; the client side does the same
(:mod:`orchestrator.api.unixsocket`). So each accepted Unix connection is
handed, socket and all, to an asyncio transport before anything is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

import anyio
from anyio.abc import SocketAttribute, SocketStream


class TransportStream(SocketStream):
    """An anyio byte stream over an asyncio ``StreamReader``/``StreamWriter`` pair (one Unix connection)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._closed = False

    @property
    def _raw_socket(self) -> socket.socket:
        # asyncio's TransportSocket: family, getsockopt (the peer's credentials), getpeername, as a socket has
        sock: socket.socket = self._writer.get_extra_info("socket")
        return sock

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            data = await self._reader.read(max_bytes)
        except OSError as exc:
            raise anyio.BrokenResourceError from exc
        if not data:
            raise anyio.EndOfStream
        return data

    async def send(self, item: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        if self._writer.is_closing():
            raise anyio.BrokenResourceError
        try:
            self._writer.write(item)
            await self._writer.drain()
        except OSError as exc:
            raise anyio.BrokenResourceError from exc

    async def send_eof(self) -> None:
        with contextlib.suppress(OSError):
            self._writer.write_eof()

    async def aclose(self) -> None:
        self._closed = True
        self._writer.close()
        with contextlib.suppress(OSError):  # the peer went first: closed either way
            await self._writer.wait_closed()


async def over_transport(stream: SocketStream) -> SocketStream:
    """``stream`` (an accepted Unix connection) as a :class:`TransportStream`: its socket is detached from the
    anyio stream (whose close then closes nothing) and given to an asyncio transport. On another event loop
    than asyncio's, ``stream`` as it is."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return stream
    raw = stream.extra(SocketAttribute.raw_socket)
    mine = socket.socket(raw.family, raw.type, fileno=raw.detach())
    await stream.aclose()
    reader, writer = await asyncio.open_unix_connection(sock=mine)
    # A send returns once the kernel took the bytes, as a raw socket's does: no user-space buffer of 64 KiB
    # beside the socket's, so a client that reads nothing holds its events back at once and, past
    # core.events_buffer, is dropped and told, as it was before.
    writer.transport.set_write_buffer_limits(high=0)
    return TransportStream(reader, writer)
