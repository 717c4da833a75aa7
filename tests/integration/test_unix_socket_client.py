"""The service client on a Unix socket: closing it while events stream in never upsets the event loop.

Every ``Orchestrator`` of a served home follows ``GET /api/events`` and
cancels that read when it leaves. Through anyio's Unix socket streams, a
cancel in the same turn of the loop as arriving data made the loop report
``InvalidStateError: invalid state`` (a selector callback setting a result
on the cancelled future): under pytest's anyio runner, a failure of
whichever test was closing its client then. The stand-in service here
streams events to every connection at once, and the test cancels the read
in the turn that another connection's data wakes it, as a test's own reads
do, for 10 s. Before the client's own Unix transport
(``api/unixsocket.py``) this caught the error in each of 3 runs of 10 s (4 to 10 times in about 1,300 closes).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest
from loop_errors import caught_loop_errors

from orchestrator.api.client import ServiceClient

EVENT = b"data: " + json.dumps({"type": "StatusChanged", "seq": 1}).encode() + b"\n\n"
CHUNK = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)


class StandIn:
    """An HTTP server on a Unix socket that streams the same event to every connection each millisecond."""

    def __init__(self) -> None:
        self.writers: set[asyncio.StreamWriter] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            self.writers.add(writer)
            await reader.read()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self.writers.discard(writer)
            writer.close()

    async def tick(self) -> None:
        while True:
            for writer in list(self.writers):
                if writer.is_closing():
                    self.writers.discard(writer)
                else:
                    writer.write(CHUNK)
            await asyncio.sleep(0.001)


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_client_closed_while_events_stream_in_leaves_no_loop_error(tmp_path: Path) -> None:
    with caught_loop_errors() as loop_errors:
        socket = tmp_path / "service.sock"
        stand_in = StandIn()
        server = await asyncio.start_unix_server(stand_in.handle, socket)
        ticking = asyncio.create_task(stand_in.tick())
        rounds, events_read, started = 0, 0, time.monotonic()
        try:
            while time.monotonic() - started < 10:
                rounds += 1
                async with ServiceClient(socket=socket) as client:
                    other_reader, other_writer = await asyncio.open_unix_connection(socket)
                    other_writer.write(b"GET /api/events HTTP/1.1\r\nhost: x\r\n\r\n")

                    async def follow(client: ServiceClient = client) -> None:
                        nonlocal events_read
                        async for event in client.events():
                            assert event["type"] == "StatusChanged"
                            events_read += 1

                    following = asyncio.create_task(follow())
                    for _ in range(random.randint(2, 6)):  # woken by the other connection's data, then cancel
                        await other_reader.read(64)
                    following.cancel()
                    with pytest.raises(asyncio.CancelledError):
                        await following
                    other_writer.close()
        finally:
            ticking.cancel()
            server.close()
    invalid = [c for c in loop_errors if isinstance(c.get("exception"), asyncio.InvalidStateError)]
    assert not invalid, f"{len(invalid)} of {rounds} closes upset the loop: {invalid[0]}"
    assert rounds > 50 and events_read > 0
