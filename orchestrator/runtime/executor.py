"""The executor: carries out a step's instructions, in order, and decides nothing.

``Persist`` is awaited (write-ahead); instructions for a backend go to its
actor's mailbox, bound to the attempts their runs are at now; long work
(preparing a job, running postprocessors, adding a linked job, a timer)
runs as a task of its own that posts its outcome as the next event;
``Reply`` answers the request waiting on it. The executor and the actors
are the only callers of drivers and of the repository.

Long work is bounded: at most ``work_limit`` pieces run at once, the rest
wait their turn; with ``work_limit`` waiting, the executor is *lagging* and
the runtime holds back new requests until it is not (timers only sleep:
they are not counted).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from ..core.errors import JobError
from ..core.events import Event, RetryDue
from ..core.ids import FQID, Runs
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
from ..core.machine import StateMachine
from ..core.step import Step
from .actor import Actor, Bound


@dataclass(slots=True)
class Waiting:
    """A request's caller, waiting for its ``Reply``."""

    done: anyio.Event = field(default_factory=anyio.Event)
    reply: Reply | None = None


def _submitted_later(instructions: Sequence[Instruction]) -> dict[int, Counter[FQID]]:
    """For each kill or lookup of a step that a submission of the same step follows: how many of those
    submissions each run gets after it (nothing to count, and nothing counted, in a step without kills)."""
    first = next((k for k, ins in enumerate(instructions) if isinstance(ins, (SendKill, Lookup))), None)
    if first is None:
        return {}
    out: dict[int, Counter[FQID]] = {}
    pending: Counter[FQID] = Counter()
    for ins in reversed(instructions[first:]):
        if isinstance(ins, SendSubmit):
            pending.update(ins.runs)
        elif isinstance(ins, (SendKill, Lookup)) and pending:
            out[id(ins)] = +pending
    return out


class Executor:
    def __init__(self, sm: StateMachine, *, actor: Callable[[str], Awaitable[Actor]],
                 flush: Callable[[], Awaitable[None]], work: dict[type[Instruction], Callable[[Any], Awaitable[None]]],
                 forget: Callable[[Forget], Awaitable[None]], set_backend: Callable[[SetBackend], None],
                 given_state: Callable[[str], str | None], post: Callable[[Event], Awaitable[None]],
                 log: Any, adjust: Callable[[AdjustRun], None] | None = None, work_limit: int = 16) -> None:
        self.sm = sm
        self._adjust = adjust
        self._actor = actor
        self._flush = flush
        self._work = work
        self._forget = forget
        self._set_backend = set_backend
        self._given_state = given_state
        self._post = post
        self.log = log
        self.waiting: dict[str, Waiting] = {}
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

    def expect(self, stimulus_id: str) -> Waiting:
        """Register the caller of a request before it is posted."""
        waiting = self.waiting[stimulus_id] = Waiting()
        return waiting

    async def carry_out(self, step: Step) -> None:
        later = _submitted_later(step.instructions)
        for ins in step.instructions:
            if isinstance(ins, Persist):
                await self._flush()
            elif isinstance(ins, (SendSubmit, SendKill, Lookup, Unwatch)):
                actor = await self._actor(ins.backend)
                actor.put(self._bind(ins, later.get(id(ins))))
            elif isinstance(ins, Reply):
                waiting = self.waiting.pop(ins.stimulus_id, None)
                if waiting is not None:
                    waiting.reply = ins
                    waiting.done.set()
            elif isinstance(ins, Forget):
                await self._forget(ins)
            elif isinstance(ins, SetBackend):
                self._set_backend(ins)
            elif isinstance(ins, AdjustRun):
                if self._adjust is not None:
                    self._adjust(ins)  # at once: the retry's submission that follows reads the new settings
            elif isinstance(ins, ScheduleRetry):
                self.spawn(self._retry_at(ins), limited=False)
            elif isinstance(ins, (Prepare, Unprepare, RunPostprocess, CreateLinked, Notify)):
                work = self._work.get(type(ins))
                if work is not None:
                    if isinstance(ins, Unprepare):
                        await work(ins)  # a rollback completes before the request is answered
                    else:
                        self.spawn(work(ins))
            else:  # a kind the core emits and the runtime was not taught: its request would wait for ever
                raise TypeError(f"no one carries out {type(ins).__name__}: {ins!r}")

    def _bind(self, ins: SendSubmit | SendKill | Lookup | Unwatch, later: Counter[FQID] | None = None) -> Bound:
        """The instruction with each run's attempt as it was when the instruction was given (and its retry
        arguments, for a submission). The state machine's attempt is the one after the whole step: a kill
        followed in the same step by the retry's submission is for the attempt before (``later`` counts
        those submissions), never the retry."""
        if isinstance(ins, Unwatch):
            return Bound(ins)
        runs = ins.runs
        attempts = [self.sm.attempt(fq) for fq in runs] if len(runs) < 4096 else self._attempts_fast(runs)
        if later:
            attempts = [a - later[fq] for a, fq in zip(attempts, runs, strict=True)]
        retry_args: dict[int, list[str]] = {}
        state = None
        if isinstance(ins, SendSubmit):
            for i in self._with_extras(runs):  # only a run with extras may have retry arguments
                args = self.sm.retry_args((runs.job,) if runs.indexes is None else (runs.job, i))
                if args:
                    retry_args[i] = args
            if ins.start == "given":
                state = self._given_state(ins.stimulus_id)
        return Bound(ins, attempts, retry_args, state)

    def _attempts_fast(self, runs: Runs) -> Sequence[int]:
        """Each run's attempt, read from the job's array (a slice of it for a range: a million, in C)."""
        table = self.sm.job_state(runs.job).runs.attempt
        idx = runs.indexes
        if isinstance(idx, range) and idx.step == 1:
            return table[idx.start:idx.stop]
        return [table[i] for i in (idx if idx is not None else [0])]

    def _with_extras(self, runs: Runs) -> list[int]:
        """The batch's runs (their table index) that have extras: looked up from the smaller side."""
        extras = self.sm.job_state(runs.job).runs.extras
        idx = runs.indexes
        if not extras:
            return []
        if idx is None:
            return [0] if 0 in extras else []
        if len(extras) < len(idx):
            members = idx if isinstance(idx, range) else set(idx)
            return sorted(i for i in extras if i in members)
        return [i for i in idx if i in extras]

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
