"""HTTP to the service's Unix socket over asyncio's own socket transports.

Why not httpx's default: on asyncio, httpx reaches a Unix socket through
anyio's ``UNIXSocketStream``, which waits for a readable socket with a
future that a selector callback resolves. When the task reading it is
cancelled in the same turn of the loop as data arrives (a client closing
while ``GET /api/events`` is streaming, which every ``Orchestrator`` does
when it leaves), the callback then sets a result on a cancelled future and
the loop reports ``InvalidStateError: invalid state``; under pytest's anyio
runner that fails the test that happened to close then. asyncio's socket
transports (``asyncio.open_unix_connection``) check for that, as anyio's TCP
streams, which use them, do too. This module gives httpcore (httpx's engine)
a network backend that opens Unix sockets that way; every other connection,
and any loop but asyncio's, keeps httpcore's own backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import typing
from collections.abc import Iterable

import httpcore
import httpx


class _UnixStream(httpcore.AsyncNetworkStream):
    """One connection: reads and writes with httpcore's timeouts and errors."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(f"no answer from the socket within {timeout} s") from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            async with asyncio.timeout(timeout):
                await self._writer.drain()
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(f"the socket took no data within {timeout} s") from exc
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):  # the peer went first: closed either way
            await self._writer.wait_closed()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("no TLS on the service's Unix socket (it is plain HTTP, guarded by its mode)")

    def get_extra_info(self, info: str) -> typing.Any:
        if info == "socket":
            return self._writer.get_extra_info("socket")
        if info == "is_readable":  # asked of an idle pooled connection: has the service closed it?
            return self._reader.at_eof() or self._writer.transport.is_closing()
        return None


class UnixBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, with Unix sockets opened by asyncio when the loop is asyncio's."""

    def __init__(self) -> None:
        self._other = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None
                          ) -> httpcore.AsyncNetworkStream:
        return await self._other.connect_tcp(host, port, timeout, local_address, socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None
                                  ) -> httpcore.AsyncNetworkStream:
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # another event loop (trio): anyio's streams
            return await self._other.connect_unix_socket(path, timeout, socket_options)
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_unix_connection(path)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"{path}: no connection within {timeout} s") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        return _UnixStream(reader, writer)

    async def sleep(self, seconds: float) -> None:
        await self._other.sleep(seconds)


class UnixTransport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport(uds=path)`` whose connections come from :class:`UnixBackend`.

    httpx takes no network backend, so the pool it made is replaced by one
    made alike with this backend (httpx's own mapping of httpcore's errors,
    streams and limits stay as they are).
    """

    def __init__(self, path: str) -> None:
        super().__init__(uds=path, verify=False)
        self._pool = httpcore.AsyncConnectionPool(uds=path, network_backend=UnixBackend(),
                                                  max_connections=100, max_keepalive_connections=20,
                                                  keepalive_expiry=5.0)
