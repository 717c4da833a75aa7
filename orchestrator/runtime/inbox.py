"""The bus's way in: requests and their replies, reports and outcomes, each under a stimulus id of its own.

- :meth:`Inbox.request` posts a user's request (built from a fresh stimulus
  id) and waits for the state machine's ``Reply``, which the executor hands
  back through :meth:`Inbox.reply`.
- :meth:`Inbox.post` puts a request or a monitoring report on the bus once
  nothing it would feed lags (backpressure: a backend's actors, the
  executor's long work); :meth:`Inbox.answer` puts an instruction's outcome
  there at once, since what it answers is what drains the backlog.
- A home opened to read only, or one whose shared repository another process
  took over (``lost``), takes nothing: every post raises and says why.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import anyio

from ..core.errors import HomeLockedError, RepositoryHeldError
from ..core.events import Event, Request
from ..core.instructions import Reply
from .bus import Bus


class Laggard(Protocol):
    """A piece the bus feeds that may fall behind: new requests and reports wait while it lags."""

    @property
    def lagging(self) -> bool: ...

    async def room(self) -> None: ...


@dataclass(slots=True)
class Waiting:
    """A request's caller, waiting for its ``Reply``."""

    done: anyio.Event = field(default_factory=anyio.Event)
    reply: Reply | None = None


class Inbox:
    """See the module docstring. ``where``: the repository, named when a post is refused for its loss."""

    def __init__(self, bus: Bus, home: Path, where: str, *, readonly: bool = False) -> None:
        self.bus = bus
        self.home = home
        self.where = where
        #: A reader of a home another process holds: every post refused.
        self.readonly = readonly
        #: Set when another process took a shared repository over: nothing more is taken.
        self.lost = False
        #: What new requests and reports wait for (``Backends``, the executor), set when the runtime is wired.
        self.laggards: Sequence[Laggard] = ()
        self._ids = itertools.count()
        self._waiting: dict[str, Waiting] = {}

    def sid(self, kind: str) -> str:
        return f"{kind}-{next(self._ids)}"

    async def post(self, event: Event) -> None:
        """Post a request or a monitoring report, once nothing it feeds lags (nothing piles up without bound)."""
        while True:
            lagging = next((p for p in self.laggards if p.lagging), None)
            if lagging is None:
                break
            await lagging.room()
        await self.answer(event)

    async def answer(self, event: Event) -> None:
        """Post the outcome of an instruction (a driver's answer, prepared work, a timer): it never waits
        for room, since what it answers is what drains the backlog."""
        if self.lost:
            raise RepositoryHeldError(f"this orchestrator may no longer write the repository {self.where} "
                                      "(another took it over, or its lease could not be renewed): open it again")
        if self.readonly:
            raise HomeLockedError(f"orchestrator home {self.home} is in use by another process, so it is open "
                                  f"here to read only; to share a home between processes, run "
                                  f"'orchestrator --home {self.home} serve' and every command goes through it")
        await self.bus.post(event)

    async def request(self, make: Callable[[str], Request], kind: str) -> Reply:
        """Post a request and wait for its answer."""
        sid = self.sid(kind)
        waiting = self._waiting[sid] = Waiting()
        await self.post(make(sid))
        await waiting.done.wait()
        assert waiting.reply is not None
        return waiting.reply

    def reply(self, ins: Reply) -> None:
        """The state machine's answer to a request: its caller wakes (a request no one waits for is passed over)."""
        waiting = self._waiting.pop(ins.stimulus_id, None)
        if waiting is not None:
            waiting.reply = ins
            waiting.done.set()
