"""The executor: carries out a step's instructions, in order, and decides nothing.

``Persist`` is awaited (write-ahead); instructions for a backend go to its
actor's mailbox with the attempts and retry arguments they carry; long work
(preparing a job, running postprocessors, adding a linked job, a timer)
runs as a task of its own that posts its outcome as the next event;
``Reply`` answers the request waiting on it (:mod:`.inbox`); the core's
edits of definitions (``SetBackend``, ``AdjustRun``) go to the definitions,
and ``Forget`` to the writer, the backends and the workspace. The executor
and the actors are the only callers of drivers and of the repository.

Long work is bounded: at most ``work_limit`` pieces run at once, the rest
wait their turn; with ``work_limit`` waiting, the executor is *lagging* and
the runtime holds back new requests until it is not (timers only sleep:
they are not counted).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from ..core.errors import JobError
from ..core.events import Event, RetryDue
from ..core.instructions import (
    AdjustRun,
    CreateLinked,
    Forget,
    Instruction,
    Lookup,
    Notify,
    Persist,
    Prepare,
    Reply,
    RunPostprocess,
    ScheduleRetry,
    SendKill,
    SendSubmit,
    SetBackend,
    Unprepare,
    Unwatch,
)
from ..core.step import Step
from .actor import Bound
from .backends import Backends
from .definitions import Definitions
from .workspace import Workspace
from .writer import Writer


class OwnerSlots:
    """Each owner's places for long work done as them (a team service: an owner's input files checked and
    copied, their postprocessors run), ``per_owner`` an owner, beside the runtime's own ``work_limit``: the owner's
    files and code may keep that work waiting for ever, and only their own work waits for it then."""

    def __init__(self, per_owner: int) -> None:
        self.per_owner = per_owner
        self._slots: dict[str, anyio.CapacityLimiter] = {}

    def of(self, owner: str) -> anyio.CapacityLimiter:
        slots = self._slots.get(owner)
        if slots is None:
            slots = self._slots[owner] = anyio.CapacityLimiter(self.per_owner)
        return slots


class Executor:
    """See the module docstring. ``work``: who carries out each kind of long work; ``reply``: the inbox's."""

    def __init__(self, *, backends: Backends, writer: Writer, definitions: Definitions, workspace: Workspace,
                 work: dict[type[Instruction], Callable[[Any], Awaitable[None]]],
                 post: Callable[[Event], Awaitable[None]], reply: Callable[[Reply], None],
                 log: Any, work_limit: int = 16, owned: Callable[[int], bool] = lambda job: False) -> None:
        self._backends = backends
        #: Whether a job's preparing and postprocessing run as its owner, on its owner's slots (not long work's).
        self._owned = owned
        self._writer = writer
        self._definitions = definitions
        self._workspace = workspace
        self._work = work
        self._post = post
        self._reply = reply
        self.log = log
        #: States users handed in for their resubmissions (``resubmit --from-state``), by stimulus id.
        self._given: dict[str, str] = {}
        self.tg: TaskGroup | None = None
        #: Tasks under way (preparations, postprocessing...): a closing home lets them finish.
        self.busy = 0
        self.idle = anyio.Event()
        self.idle.set()
        #: Long work at once, and waiting past which the executor lags (see the module docstring).
        self.work_limit = work_limit
        self._slots = anyio.CapacityLimiter(work_limit)
        self.waiting_work = 0
        self._room = anyio.Event()
        self._room.set()

    @property
    def lagging(self) -> bool:
        return self.waiting_work >= self.work_limit

    async def room(self) -> None:
        """Until the executor is not lagging."""
        while self.lagging:
            await self._room.wait()

    def given_state(self, sid: str, text: str) -> None:
        """A state the user handed in for the resubmission ``sid`` (``resubmit --from-state``)."""
        self._given[sid] = text

    async def carry_out(self, step: Step) -> None:
        for ins in step.instructions:
            if isinstance(ins, Persist):
                await self._writer.flush()
            elif isinstance(ins, (SendSubmit, SendKill, Lookup, Unwatch)):
                actor = await self._backends.actor(ins.backend)
                actor.put(self._bind(ins))
            elif isinstance(ins, Reply):
                self._reply(ins)
            elif isinstance(ins, Forget):
                await self._writer.forget(ins.job)
                self._backends.forget(ins.job)
                self._workspace.remove((ins.job,))
            elif isinstance(ins, SetBackend):
                self._definitions.change_backend(ins)
            elif isinstance(ins, AdjustRun):
                self._definitions.adjust(ins)  # at once: the retry's submission that follows reads the new settings
            elif isinstance(ins, ScheduleRetry):
                self.spawn(self._retry_at(ins), limited=False)
            elif isinstance(ins, (Prepare, Unprepare, RunPostprocess, CreateLinked, Notify)):
                work = self._work.get(type(ins))
                if work is not None:
                    if isinstance(ins, Unprepare):
                        # A flush under way may hold the split's rows, read before the rollback: it ends first,
                        # or it would store them again after the rollback removed them. The rollback then
                        # completes before the request is answered.
                        await self._writer.flush()
                        await work(ins)
                    else:  # (an owner's preparing and postprocessing take its owner's slots: OwnerSlots)
                        owned = isinstance(ins, (Prepare, RunPostprocess)) and self._owned(ins.job)
                        self.spawn(work(ins), limited=not owned)
            else:  # a kind the core emits and the runtime was not taught: its request would wait for ever
                raise TypeError(f"no one carries out {type(ins).__name__}: {ins!r}")

    def _bind(self, ins: SendSubmit | SendKill | Lookup | Unwatch) -> Bound:
        """The instruction with what the actor needs beside it: the attempts and retry arguments it carries, and
        a state the user handed in for its request (``start="given"``)."""
        if isinstance(ins, Unwatch):
            return Bound(ins)
        if isinstance(ins, SendSubmit):
            state = self._given.get(ins.stimulus_id) if ins.start == "given" else None
            return Bound(ins, ins.attempts, {i: list(a) for i, a in ins.retry_args.items()}, state)
        return Bound(ins, ins.attempts)

    def spawn(self, work: Awaitable[None], *, limited: bool = True) -> None:
        """Run long work in the runtime's task group, ``work_limit`` at once (``limited``); it posts its own
        outcome."""
        assert self.tg is not None, "the runtime is not running"
        self.busy += 1
        self.idle = anyio.Event()
        if limited:
            self.waiting_work += 1
            if self.lagging and self._room.is_set():
                self._room = anyio.Event()

        async def run() -> None:
            try:
                if limited:
                    async with self._slots:
                        self.waiting_work -= 1
                        if not self.lagging:
                            self._room.set()
                        await work
                else:
                    await work
            except JobError as exc:
                self.log.warning("work failed", error=str(exc))
            except Exception as exc:  # a bug in one piece of work must not stop the runtime
                self.log.exception("work failed", error=repr(exc))
            finally:
                self.busy -= 1
                if not self.busy:
                    self.idle.set()

        self.tg.start_soon(run)

    async def _retry_at(self, ins: ScheduleRetry) -> None:
        import time

        await anyio.sleep(max(0.0, ins.at - time.time()))
        await self._post(RetryDue(stimulus_id=ins.stimulus_id, time=time.time(), runs=ins.runs))
