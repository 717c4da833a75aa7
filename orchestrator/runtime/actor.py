r"""A driver actor: the one task that calls one backend's driver.

It takes the instructions meant for its backend in the order the state
machine gave them, and carries each out: submissions that arrive within a
tick go to the driver as one bulk call (grouped by settings, since a bulk
call carries runs of one kind), or run by run where the driver has no bulk
form; kills likewise; lookups after a restart. Each answer becomes the
event the instruction's stimulus id is waiting for.

Its mailbox is bounded with backpressure: past ``capacity`` instructions
waiting, the actor is *lagging*, and the runtime holds back what would give
it more (new requests, monitoring reports) until it has taken them. The bus
itself never waits on an actor (an actor waits on the bus to post its
answers: a cycle of two bounded waits could stop both), so one step's
instructions always go in, and the mailbox holds at most ``capacity`` plus
what the steps under way when it filled asked for.

A submission goes out in chunks of at most ``core.submit_chunk`` runs: each
chunk's ``RunSpec``\ s are made, sent, registered and answered (a
``SubmitOutcomes`` with ``more`` set until the last) before the next is
made, so a master of a million subjobs never has a million specs at once,
and its first runs are watched while the last are being sent.

It holds the runs its driver answered for (:mod:`.holding`, kept compactly
by :mod:`.held`: a few bytes each) until they end: a status query that does not mention a run, or a slow host
elsewhere, is no reason to let go of one. Monitoring them is
:mod:`.monitor`'s part.

An instruction is bound, when the runtime takes it, to the attempt each of
its runs was at: a kill issued before a retry's submission in the same
step kills the attempt before, never the retry.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from ..core.events import Event, KillOutcomes, LookupOutcomes, SubmitOutcomes
from ..core.ids import Runs
from ..core.instructions import Instruction, Lookup, SendKill, SendSubmit, Unwatch
from ..core.statuses import JobStatus
from ..plugin.contract import Driver, RunSpec
from ..plugin.fairshare import FairQueue
from . import bulk, gcpause
from .held import MakeHandle, RunKey
from .holding import Holding
from .runs import RunFiles

#: Runs per chunk of a submission (``core.submit_chunk``): its specs are made, sent and answered before the next
#: chunk's are made.
CHUNK = 10_000


@dataclass(slots=True)
class Bound:
    """An instruction, with what it was bound to when taken: each run's attempt, and retry arguments."""

    instruction: Instruction
    attempts: Sequence[int] = ()
    retry_args: dict[int, list[str]] = field(default_factory=dict)
    #: A state the user handed in for ``start="given"``.
    state: str | None = None


def keys(runs: Runs) -> list[RunKey]:
    return [(runs.job, None)] if runs.indexes is None else [(runs.job, i) for i in runs.indexes]


class Actor:
    """One backend's actor; see the module docstring. ``files`` gets runs of a job ready to start (their state);
    ``post`` puts an event on the bus."""

    def __init__(self, name: str, driver: Driver, *, post: Callable[[Event], Awaitable[None]],
                 run_specs: Callable[[Runs, Sequence[int], dict[int, list[str]]], list[RunSpec]],
                 files: RunFiles,
                 record_ids: Callable[[int, Sequence[int] | None, Sequence[str]], None], make_handle: MakeHandle,
                 concurrency: int, log: Any, chunk: int = CHUNK, capacity: int = 1024,
                 confirm: Callable[[], Awaitable[None]] | None = None) -> None:
        self.name = name
        #: Awaited before a backend hears of runs: this process is still the repository's writer (a shared
        #: repository's lease; it raises once another process took over, and nothing is sent).
        self.confirm = confirm
        self.driver = driver
        self.post = post
        self.run_specs = run_specs
        self.files = files
        self.record_ids = record_ids
        self.concurrency = concurrency
        self.log = log
        self.chunk = max(1, chunk)
        #: The runs this driver holds, until they end.
        #: The runs this driver holds, until they end: the one owner of what is known of each (:mod:`.holding`).
        self.holding = Holding(make_handle, lambda settings: not driver.capabilities_for(settings).reports)
        #: Failed calls to the driver (and, counted by the monitor, failed or garbled status queries).
        self.faults = bulk.Faults()
        #: Held while a driver call's answers are being registered: a reporting driver's word on a run it
        #: just accepted waits until the run is held (its report may come before the call returns).
        self._registering = anyio.Lock()
        self._mailbox: deque[Bound] = deque()
        #: Instructions waiting past which the actor is lagging (see the module docstring).
        self.capacity = capacity
        self._room = anyio.Event()
        self._room.set()
        self._wake = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()

    # ------------------------------------------------------------ the runs held
    def _hold(self, job: int, runs: Sequence[RunSpec], backend_ids: Sequence[str], whole: bool) -> None:
        """The driver answered for these runs of ``job`` (``whole``: the job itself, without subjobs)."""
        if runs:
            self.holding.hold(job, None if whole else [r.index for r in runs], backend_ids,
                              [r.attempt for r in runs], [r.settings for r in runs], JobStatus.SUBMITTED)

    async def registered(self) -> None:
        """Until the driver call under way (if any) has had its answers registered: the runs it got are held."""
        async with self._registering:
            pass

    # ------------------------------------------------------------ intake
    def put(self, bound: Bound) -> None:
        """Take an instruction (never blocks: the bus must not wait on an actor, see the module docstring)."""
        self._mailbox.append(bound)
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        if len(self._mailbox) >= self.capacity and self._room.is_set():
            self._room = anyio.Event()
        self._wake.set()

    @property
    def queued(self) -> int:
        """Instructions waiting to be taken."""
        return len(self._mailbox)

    @property
    def lagging(self) -> bool:
        """At least ``capacity`` instructions are waiting (see the module docstring)."""
        return len(self._mailbox) >= self.capacity

    async def room(self) -> None:
        """Until the actor is not lagging."""
        while self.lagging:
            await self._room.wait()

    async def drained(self) -> None:
        """Until every instruction taken so far was carried out."""
        await self._idle.wait()

    async def run(self) -> None:
        while True:
            if not self._mailbox:
                self._idle.set()
                await self._wake.wait()
            self._wake = anyio.Event()
            taken = list(self._mailbox)
            self._mailbox.clear()
            self._room.set()
            for group in _coalesce(taken):
                # every line of the work, the driver's own included, names the request(s) it serves
                with structlog.contextvars.bound_contextvars(stimulus_id=_stimuli(group)):
                    try:
                        if isinstance(group[0].instruction, SendSubmit):
                            await self._submit(group)  # registers chunk by chunk
                        else:
                            async with self._registering:
                                await self._carry_out(group)
                    except Exception as exc:  # a bug here must not stop the backend's actor: log and go on
                        self.log.exception("instruction failed", backend=self.name, error=repr(exc))

    async def _carry_out(self, group: list[Bound]) -> None:
        first = group[0].instruction
        for bound in group:  # one at a time: each under its own stimulus id
            with structlog.contextvars.bound_contextvars(stimulus_id=bound.instruction.stimulus_id):
                if isinstance(first, SendKill):
                    await self._kill(bound)
                elif isinstance(first, Lookup):
                    await self._lookup(bound)
                elif isinstance(bound.instruction, Unwatch):
                    runs = bound.instruction.runs
                    gone = self.holding.let_go(runs.job, runs.indexes, handles=True)
                    if gone:
                        await self.driver.forget(gone)

    # ------------------------------------------------------------ submit
    async def _submit(self, group: list[Bound]) -> None:
        """Every SendSubmit of the group, chunk by chunk (``chunk`` runs at most, taken in order across the
        group's instructions); each chunk as few driver calls as the settings allow."""
        pieces = [_Piece(b, lo, min(lo + self.chunk, len(_runs(b))), lo + self.chunk >= len(_runs(b)))
                  for b in group for lo in range(0, len(_runs(b)), self.chunk)]
        chunk: list[_Piece] = []
        size = 0
        stopped: set[int] = set()  # instructions that stopped at a failure (keep_going=False)
        for piece in pieces:
            if chunk and size + len(piece) > self.chunk:
                with gcpause.paused():
                    await self._submit_chunk(chunk, stopped)
                chunk, size = [], 0
            if id(piece.bound) not in stopped:
                chunk.append(piece)
                size += len(piece)
        if chunk:
            with gcpause.paused():
                await self._submit_chunk(chunk, stopped)

    async def _submit_chunk(self, chunk: list[_Piece], stopped: set[int]) -> None:
        """One chunk: its specs made, its runs readied and sent, the accepted held, each piece answered."""
        specs: list[list[RunSpec]] = []
        unready: list[dict[str, str]] = []
        states: dict[str, dict[str, Any]] = {}
        for piece in chunk:
            ins = piece.instruction
            batch = self.run_specs(piece.runs, piece.bound.attempts[piece.lo:piece.hi], piece.bound.retry_args)
            specs.append(batch)
            refused, started = await self.files.prepare(ins.runs.job, batch, ins.start, piece.bound.state)
            unready.append(refused)
            states.update(started)
        answers: list[list[Any]] = [[None] * len(s) for s in specs]
        native_of: list[bool] = [True] * len(chunk)
        ins0 = chunk[0].instruction
        # One call per settings (a bulk call carries runs of one kind); a stop-at-first-failure series alone.
        by_settings: dict[str, list[tuple[int, int]]] = {}
        named: dict[int, str] = {}  # runs of one batch share their settings object: each is written out once
        for g, batch in enumerate(specs):
            for k, run in enumerate(batch):
                if run.fqid in unready[g]:
                    answers[g][k] = ("reject", unready[g][run.fqid])
                    continue
                name = named.get(id(run.settings))
                if name is None:
                    name = named[id(run.settings)] = json.dumps(run.settings, sort_keys=True, default=str)
                by_settings.setdefault(name, []).append((g, k))
        async with self._registering:
            for members in by_settings.values():
                members = _by_owner(members, specs)  # emulated, they go out a few at a time: owners in turn
                runs = [specs[g][k] for g, k in members]
                if self.confirm is not None:
                    await self.confirm()
                outcomes, native = await bulk.submit(self.driver, runs, native=ins0.native,
                                                     stop_on_failure=ins0.stop_on_failure,
                                                     concurrency=self.concurrency, faults=self.faults)
                for (g, k), outcome in zip(members, outcomes, strict=True):
                    native_of[g] = native_of[g] and native
                    answers[g][k] = outcome
            for g, piece in enumerate(chunk):
                failed = await self._answer_submit(piece, specs[g], answers[g], native_of[g], states)
                # keep_going=False: an emulated series stops at its first failure, a native one when a call failed
                # as a whole (a run the backend refused is that run's failure; its siblings were attempted)
                whole = not piece.instruction.native or not native_of[g]
                if failed and whole and piece.instruction.stop_on_failure and not piece.last:
                    stopped.add(id(piece.bound))  # the rest of the series is not attempted
                    rest = _Piece(piece.bound, piece.hi, len(_runs(piece.bound)), True)
                    await self._answer_submit(rest, [], [None] * len(rest), native_of[g], {})

    async def _answer_submit(self, piece: _Piece, specs: list[RunSpec], answers: list[Any], native: bool,
                             states: dict[str, dict[str, Any]]) -> bool:
        """Hold the accepted runs and post the piece's outcome; whether any run failed or was not attempted."""
        ins = piece.instruction
        accepted, rejected, not_attempted = [], [], []
        taken: list[RunSpec] = []
        ids: list[str] = []
        for k, answer in enumerate(answers):
            if answer is None:
                not_attempted.append(k)
            elif isinstance(answer, tuple):
                rejected.append((k, answer[1]))
            elif answer.ok:
                accepted.append(k)
                taken.append(specs[k])
                ids.append(answer.backend_id)
            else:
                rejected.append((k, answer.error or "submission refused"))
        whole = ins.runs.indexes is None
        self.record_ids(ins.runs.job, None if whole else [r.index for r in taken], ids)
        self._hold(ins.runs.job, taken, ids, whole)
        started = {k: states[specs[k].fqid] for k in accepted if specs[k].fqid in states}
        await self.post(SubmitOutcomes(stimulus_id=ins.stimulus_id, time=_now(), runs=piece.runs,
                                       accepted=range(len(answers)) if len(accepted) == len(answers) else accepted,
                                       rejected=rejected, not_attempted=not_attempted, native=native, states=started,
                                       more=not piece.last, first=None if piece.lo == 0 else _first(ins.runs)))
        return bool(rejected or not_attempted)

    # ------------------------------------------------------------ kill
    async def _kill(self, bound: Bound) -> None:
        ins = bound.instruction
        assert isinstance(ins, SendKill)
        positions, handles, gone = [], [], []
        run_keys = keys(ins.runs)
        for k, key in enumerate(run_keys):
            handle = self.holding.take_lost(key) or self.holding.handle(key)
            attempt = bound.attempts[k] if k < len(bound.attempts) else 0
            if handle is None or (attempt and handle.attempt and handle.attempt != attempt):
                gone.append(k)  # it ended, or that attempt is no longer the one held: nothing runs to kill
            else:
                positions.append(k)
                handles.append(handle)
        results = await bulk.kill(self.driver, handles, native=ins.native, stop_on_failure=ins.stop_on_failure,
                                  concurrency=self.concurrency, faults=self.faults) if handles else []
        killed, failed, not_attempted = list(gone), [], []
        for k, handle, result in zip(positions, handles, results, strict=True):
            if result is None:
                killed.append(k)
                job, i = run_keys[k]
                self.holding.let_go(job, None if i is None else [i])
            elif result is False:
                not_attempted.append(k)
            else:
                failed.append((k, f"{handle.fqid}: {result}" if isinstance(result, str) else "kill failed"))
        await self.post(KillOutcomes(stimulus_id=ins.stimulus_id, time=_now(), runs=ins.runs, killed=sorted(killed),
                                     failed=failed, not_attempted=not_attempted))

    # ------------------------------------------------------------ lookup
    async def _lookup(self, bound: Bound) -> None:
        """Runs a crash caught mid-submission: asked of the backend by key until it can answer."""
        ins = bound.instruction
        assert isinstance(ins, Lookup)
        specs = self.run_specs(ins.runs, bound.attempts, bound.retry_args)
        while True:
            try:
                found = list(await self.driver.lookup(specs))
                if len(found) != len(specs):
                    raise RuntimeError(f"lookup answered {len(found)} ids for {len(specs)} runs")
                for spec, backend_id in zip(specs, found, strict=True):
                    if backend_id and (why := bulk.unusable_id(backend_id)):
                        raise RuntimeError(f"lookup answered an unusable backend id for {spec.fqid}: {why}")
                break
            except Exception as exc:  # the backend's fault: its runs stay submitting, it is asked again
                self.faults.count("lookup")
                self.log.warning("lookup of interrupted submissions failed; will ask again", backend=self.name,
                                 error=repr(exc), fqid=str(ins.runs.job))
                await anyio.sleep(1.0)
        have = [k for k, backend_id in enumerate(found) if backend_id]
        absent = [k for k, backend_id in enumerate(found) if not backend_id]
        job, whole = ins.runs.job, ins.runs.indexes is None
        adopted = [specs[k] for k in have]
        ids = [str(found[k]) for k in have]
        self.record_ids(job, None if whole else [r.index for r in adopted], ids)
        self._hold(job, adopted, ids, whole)
        reported = [r.index for r in adopted if self.driver.capabilities_for(r.settings).reports]
        if reported:  # a reporting driver hears of a run adopted after a restart as of one reattached
            await self.driver.track(self.holding.handles(job, None if whole else reported))
        if have:
            self.log.info("interrupted submissions found at the backend: adopted", backend=self.name,
                          fqid=str(ins.runs.job), count=len(have))
        if absent:
            self.log.info("interrupted submissions never reached the backend: sent again", backend=self.name,
                          fqid=str(ins.runs.job), count=len(absent))
        await self.post(LookupOutcomes(stimulus_id=ins.stimulus_id, time=_now(), runs=ins.runs, found=have,
                                       absent=absent))


def _stimuli(group: list[Bound]) -> str:
    """The stimulus id of a group's instructions; several, comma-separated, when one bulk call serves them."""
    return ",".join(dict.fromkeys(b.instruction.stimulus_id for b in group))


@dataclass(slots=True)
class _Piece:
    """Positions ``lo:hi`` of one instruction's runs, sent in one chunk; ``last``: the instruction's last piece."""

    bound: Bound
    lo: int
    hi: int
    last: bool

    @property
    def instruction(self) -> SendSubmit:
        ins = self.bound.instruction
        assert isinstance(ins, SendSubmit)
        return ins

    @property
    def runs(self) -> Runs:
        runs = self.instruction.runs
        if runs.indexes is None or (self.lo == 0 and self.hi == len(runs.indexes)):
            return runs
        return Runs(runs.job, runs.indexes[self.lo:self.hi])

    def __len__(self) -> int:
        return self.hi - self.lo


def _first(runs: Runs) -> int:
    """The first run of an instruction's (what its parts name it by: :attr:`SubmitOutcomes.first`)."""
    assert runs.indexes is not None and len(runs.indexes)
    return runs.indexes[0]


def _runs(bound: Bound) -> Runs:
    assert isinstance(bound.instruction, SendSubmit)
    return bound.instruction.runs


def _by_owner(members: list[tuple[int, int]], specs: list[list[RunSpec]]) -> list[tuple[int, int]]:
    """Runs of several owners, round-robin by owner (each owner's in their order), so that one user's many runs
    do not hold another's few behind them while a backend takes them a few at a time; one owner's: as they are."""
    first = specs[members[0][0]][members[0][1]].owner if members else None
    if all(specs[g][k].owner == first for g, k in members):
        return members
    fair: FairQueue[tuple[int, int]] = FairQueue(lambda m: specs[m[0]][m[1]].owner)
    for member in members:
        fair.append(member)
    return [fair.popleft() for _ in range(len(members))]


def _coalesce(taken: list[Bound]) -> list[list[Bound]]:
    """Consecutive instructions of one kind go together; submissions merge only when they may share a call."""
    groups: list[list[Bound]] = []
    for bound in taken:
        ins = bound.instruction
        last = groups[-1][0].instruction if groups else None
        mergeable = isinstance(ins, SendSubmit) and isinstance(last, SendSubmit) and not ins.stop_on_failure \
            and not last.stop_on_failure and ins.native == last.native
        if mergeable or (type(ins) is type(last) and not isinstance(ins, SendSubmit)):
            groups[-1].append(bound)
        else:
            groups.append([bound])
    return groups


def _now() -> float:
    import time

    return time.time()
