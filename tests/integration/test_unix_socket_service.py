"""The service's side of its Unix socket: stopping while clients send never upsets the event loop.

A service that stops (SIGTERM, a standby taking over) cancels every
connection's read. Through anyio's Unix socket streams, a cancel in the same
turn of the loop as arriving data made the loop report ``InvalidStateError:
invalid state`` with a traceback on the service's stderr (a selector callback
setting a result on the cancelled future; seen by the suite's SIGTERM test
under load). Here clients send a byte each millisecond on every connection
while the server's task group is cancelled in the turn that data on another
socket wakes it, over and over for 10 s; the service hands each accepted
connection to an asyncio transport (``service/unixstream.py``), which checks
for that.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from pathlib import Path

import anyio
import pytest
from loop_errors import caught_loop_errors

from orchestrator.service.http import Limits, Request, Response, Server


async def answer(request: Request) -> Response:
    return Response.json({"path": request.path})


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_server_cancelled_while_clients_send_leaves_no_loop_error(tmp_path: Path) -> None:
    with caught_loop_errors() as loop_errors:
        path = tmp_path / "service.sock"
        rounds, answered, started = 0, 0, time.monotonic()
        while time.monotonic() - started < 10:
            rounds += 1
            listener = await anyio.create_unix_listener(path)
            writers: list[asyncio.StreamWriter] = []
            probe_in, probe_out = socket.socketpair()
            probe_in.setblocking(False)
            async with anyio.create_task_group() as tg:
                tg.start_soon(Server(answer, Limits()).serve, listener, "unix", tg)
                for _ in range(4):
                    reader, writer = await asyncio.open_unix_connection(path)
                    writer.write(b"GET /ping HTTP/1.1\r\nhost: x\r\n\r\n")  # one answered, then a byte a tick
                    writers.append(writer)
                if rounds == 1:
                    answered += (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")

                async def feed(writers: list[asyncio.StreamWriter] = writers,
                               probe_out: socket.socket = probe_out) -> None:
                    while True:
                        for w in writers:
                            w.write(b"G")
                        probe_out.send(b"x")
                        await asyncio.sleep(0.001)

                async def cancel_on_probe(probe_in: socket.socket = probe_in) -> None:
                    await anyio.sleep(random.uniform(0.005, 0.03))
                    await anyio.wait_readable(probe_in)  # woken in the turn the clients' bytes arrive too
                    tg.cancel_scope.cancel()

                tg.start_soon(feed)
                tg.start_soon(cancel_on_probe)
            for w in writers:
                w.close()
            probe_in.close()
            probe_out.close()
            path.unlink(missing_ok=True)
            await asyncio.sleep(0)  # the callbacks queued by the cancelled reads run now
    assert answered == 1 and rounds > 50, (answered, rounds)
    assert not loop_errors, f"{len(loop_errors)} loop errors in {rounds} rounds: {loop_errors[0]}"
