"""The event bus: anyio memory streams between the API, the engine and drivers.

Reports from drivers travel on one stream to the engine, which alone feeds
them to the state machine. ``StatusChanged`` events fan out to every
subscriber (waiters, the service's watchers, logs); a subscriber too slow to
keep up loses its subscription rather than stall the engine.
"""

from __future__ import annotations

import math

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .events import Event, StatusChanged


class EventBus:
    def __init__(self) -> None:
        send, receive = anyio.create_memory_object_stream[Event](math.inf)
        self._reports_in: MemoryObjectSendStream[Event] = send
        self.reports: MemoryObjectReceiveStream[Event] = receive
        self._subscribers: list[MemoryObjectSendStream[StatusChanged]] = []

    def report(self, event: Event) -> None:
        """A driver-side report for the engine (never blocks: the stream is unbounded)."""
        self._reports_in.send_nowait(event)

    def subscribe(self, max_buffer: int = 10_000) -> MemoryObjectReceiveStream[StatusChanged]:
        send, receive = anyio.create_memory_object_stream[StatusChanged](max_buffer)
        self._subscribers.append(send)
        return receive

    def publish(self, event: StatusChanged) -> None:
        keep = []
        for send in self._subscribers:
            try:
                send.send_nowait(event)
                keep.append(send)
            except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                send.close()
        self._subscribers = keep

    def close(self) -> None:
        self._reports_in.close()
        for send in self._subscribers:
            send.close()
        self._subscribers = []
