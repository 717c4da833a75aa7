"""The event bus: every event, one at a time, through the state machine; every step to its observers.

Producers (the API's requests, the actors' outcomes and reports, timers)
``await post(event)`` on a bounded stream: when the loop falls behind they
wait, so nothing grows without bound. The one consumer takes each event,
binds its stimulus id into the log context, hands it to the state machine,
tells the observers (the event and every change it made, in order), and
has the executor carry out the step before it takes the next event. Its way
in, with backpressure and the requests' replies, is :mod:`.inbox`.

Observers (``orch.events()``, the service's stream, the status page,
metrics) each get a bounded stream of their own (``events_buffer`` items);
one that falls that far behind is dropped rather than allowed to stall the
loop or grow without bound: the items it has not read stay readable, then it
gets :class:`Lagging` (``orch.events()`` raises it; the service's stream
sends a ``lagging`` event and ends).
Waiters (``job.wait()``) are woken after every step.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

import anyio
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..core.errors import Lagging
from ..core.events import Event
from ..core.machine import StateMachine
from ..core.step import Step

#: Events that may wait on the bus before producers wait too.
CAPACITY = 1024


class Bus:
    def __init__(self, sm: StateMachine, log: Any, *, observer_capacity: int = 100_000) -> None:
        self.sm = sm
        self.log = log
        send, receive = anyio.create_memory_object_stream[Event](CAPACITY)
        self._in: MemoryObjectSendStream[Event] = send
        self._out: MemoryObjectReceiveStream[Event] = receive
        self._observers: list[tuple[MemoryObjectSendStream[Any], bool]] = []
        self.observer_capacity = observer_capacity
        self._changed = anyio.Event()
        #: Hooks called with every step (the writer's wake-up, metrics).
        self.hooks: list[Callable[[Event, Step], None]] = []
        self.handled = 0
        self.closed = False
        #: An event taken from the queue is being handled and carried out (a closing home waits for it).
        self.busy = False

    async def post(self, event: Event) -> None:
        """Queue an event. Once the bus is closed (the home is closing) an event is dropped: what it
        reported is asked again after the next open (a run's status is polled, a request was answered)."""
        if self.closed:
            return
        with suppress(anyio.ClosedResourceError):
            await self._in.send(event)

    @property
    def queued(self) -> int:
        """Events posted and not yet taken."""
        return self._in.statistics().current_buffer_used

    async def run(self, carry_out: Callable[[Step], Awaitable[None]]) -> None:
        """Take each event in turn; ``carry_out``: the executor's, awaited before the next event is taken."""
        async for event in self._out:
            if self.closed:  # the home is closing: what is still queued is dropped, as post() drops it
                continue
            self.busy = True
            with structlog.contextvars.bound_contextvars(stimulus_id=event.stimulus_id):
                try:
                    step = self.sm.handle(event)
                    self.handled += 1
                    for refusal in step.refusals:
                        self.log.info("refused", fqid=".".join(map(str, refusal.fqid)), reason=refusal.reason)
                    self._tell(event, step)
                    for hook in self.hooks:
                        hook(event, step)
                    await carry_out(step)
                finally:
                    self.busy = False
                    self._changed.set()
                    self._changed = anyio.Event()

    # ------------------------------------------------------------ observers
    def subscribe(self, capacity: int | None = None, *, numbered: bool = False) -> MemoryObjectReceiveStream[Any]:
        """Every event and change from now on, in order; ``numbered``: as ``(step, item)``, ``step`` being
        the number of the event that made it (what a snapshot's ``step`` is compared with). ``capacity``:
        items it may fall behind before it is dropped (default ``observer_capacity``)."""
        capacity = self.observer_capacity if capacity is None else capacity
        send, receive = anyio.create_memory_object_stream[Any](capacity + 1)  # room for the notice of lagging
        self._observers.append((send, numbered))
        return receive

    def _tell(self, event: Event, step: Step) -> None:
        if not self._observers:
            return
        items: list[Any] = [event, *(c.as_event() for c in step.changes)]
        keep = []
        for send, numbered in self._observers:
            stats = send.statistics()
            if stats.current_buffer_used + len(items) >= stats.max_buffer_size:
                with suppress(anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    send.send_nowait(Lagging(f"the observer fell more than {stats.max_buffer_size - 1} events behind "
                                             "the event bus (core.events_buffer) and was dropped"))
                send.close()
                continue
            try:
                for item in items:
                    send.send_nowait((self.handled, item) if numbered else item)
                keep.append((send, numbered))
            except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                send.close()
        self._observers = keep

    async def changed(self) -> None:
        """Until the next step has been carried out."""
        await self._changed.wait()

    def close(self) -> None:
        self.closed = True
        self._in.close()
        for send, _ in self._observers:
            send.close()
        self._observers = []
