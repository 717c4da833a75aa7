"""Calling a driver in bulk: natively when it declares it, emulated run by run otherwise.

Emulated bulk follows docs/design.md: a series that must stop at the first
failure (keep_going=False) goes one run at a time in index order and
reports the rest as not attempted; otherwise every run is attempted, at
most ``concurrency`` at once. A bulk call that raises, or answers the wrong
number of outcomes, counts as nothing submitted (every run left as it was).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio

from ..core.stored import MAX_TEXT, kept, text_fault
from ..plugin.contract import Driver, RunHandle, RunSpec, SubmitError, SubmitOutcome

T = TypeVar("T")
R = TypeVar("R")


class Faults:
    """Failed calls to one backend's driver, by call (``submit``, ``kill``, ``status``, ``lookup``...): a
    call that raised (a run refused with ``SubmitError`` is the backend's answer, not a fault) or answered
    nonsense. Counted for the metrics; the outcomes themselves go to the state machine as ever."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def count(self, call: str, n: int = 1) -> None:
        self.counts[call] = self.counts.get(call, 0) + n


#: The longest backend id the runtime holds (a Slurm id, a gLite job URL: some tens of characters).
MAX_BACKEND_ID = 4096


def unusable_id(value: object) -> str | None:
    """Why a driver's answer cannot be a run's backend id, or ``None`` when it can: the id is stored, and is all a
    later process gets (text the repository keeps as it is: no NUL, no lone surrogate, at most
    :data:`MAX_BACKEND_ID` characters). An id the repository refused was put back in the writer's queue at every
    flush: nothing of the home was written again."""
    if not isinstance(value, str):
        return f"not text but {type(value).__name__}"
    if not value:
        return "empty"
    if len(value) > MAX_BACKEND_ID:
        return f"{len(value)} characters (at most {MAX_BACKEND_ID})"
    fault = text_fault(value)
    if fault == "NUL":
        return "a NUL character in it"
    return "a character UTF-8 cannot encode in it (a lone surrogate)" if fault else None


def checked(outcome: SubmitOutcome, faults: Faults) -> SubmitOutcome:
    """``outcome``, or, if it accepted the run under an id the runtime cannot hold, the run refused with why (a
    fault of the driver's, counted)."""
    if outcome.error is not None and len(outcome.error) > MAX_TEXT:  # (a driver's error is stored as its reason)
        return SubmitOutcome(outcome.fqid, None, kept(outcome.error))
    if outcome.backend_id is None or outcome.error is not None or (why := unusable_id(outcome.backend_id)) is None:
        return outcome
    faults.count("submit")
    return SubmitOutcome(outcome.fqid, None, f"the backend answered an unusable backend id: {why}")


def describe(exc: BaseException) -> str:
    """A driver's exception as the reason its runs keep (:data:`~orchestrator.core.stored.MAX_TEXT` of it)."""
    if isinstance(exc, SubmitError):
        return kept(str(exc)) or "submission refused"
    return kept(f"{type(exc).__name__}: {exc}")


async def each(items: Sequence[T], call: Callable[[T], Awaitable[R]], *, stop: Callable[[R], bool] | None,
               concurrency: int) -> list[R | None]:
    """``call`` each item; with ``stop``, one at a time until ``stop(result)``. ``None``: never attempted."""
    results: list[R | None] = [None] * len(items)
    if stop is not None:
        for i, item in enumerate(items):
            results[i] = result = await call(item)
            if stop(result):
                break
        return results
    # ``concurrency`` workers take the items in order: a task per worker, not per item (ten thousand waiting
    # tasks cost some 2.5 KB each, all at once, and their memory stays with the process once freed)
    order = iter(range(len(items)))

    async def worker() -> None:
        for i in order:
            results[i] = await call(items[i])

    async with anyio.create_task_group() as tg:
        for _ in range(min(max(1, concurrency), len(items))):
            tg.start_soon(worker)
    return results


async def submit(driver: Driver, runs: Sequence[RunSpec], *, native: bool, stop_on_failure: bool,
                 concurrency: int, faults: Faults | None = None) -> tuple[list[SubmitOutcome | None], bool]:
    """One outcome per run (``None``: not attempted), and whether it went out as one native call."""
    faults = faults or Faults()
    if native:
        try:
            outcomes = list(await driver.submit_bulk(runs))
        except Exception as exc:  # the whole call failed: nothing was submitted
            faults.count("submit")
            return [SubmitOutcome(r.fqid, None, describe(exc)) for r in runs], False
        if len(outcomes) != len(runs):
            faults.count("submit")
            wrong = f"the driver answered {len(outcomes)} outcomes for {len(runs)} runs"
            return [SubmitOutcome(r.fqid, None, wrong) for r in runs], False
        return [checked(o, faults) for o in outcomes], True

    async def one(run: RunSpec) -> SubmitOutcome:
        try:
            return checked(SubmitOutcome(run.fqid, await driver.submit(run)), faults)
        except SubmitError as exc:  # the backend refused this run: its answer, not a fault
            return SubmitOutcome(run.fqid, None, describe(exc))
        except Exception as exc:  # any driver failure leaves this run unsubmitted
            faults.count("submit")
            return SubmitOutcome(run.fqid, None, describe(exc))

    stop = (lambda o: not o.ok) if stop_on_failure else None
    return await each(runs, one, stop=stop, concurrency=concurrency), False


async def kill(driver: Driver, handles: Sequence[RunHandle], *, native: bool, stop_on_failure: bool,
               concurrency: int, faults: Faults | None = None) -> list[str | None | bool]:
    """One entry per handle: ``None`` killed, a message on failure, ``False`` not attempted."""
    faults = faults or Faults()
    if native:
        try:
            return list(await driver.kill_bulk(handles))
        except Exception as exc:  # the bulk call failed as a whole
            faults.count("kill")
            return [describe(exc)] * len(handles)

    async def one(h: RunHandle) -> str:
        try:
            await driver.kill(h)
        except Exception as exc:  # reported per run: the core decides by keep_going
            faults.count("kill")
            return describe(exc) or "kill failed"
        return ""

    stop = (lambda r: r != "") if stop_on_failure else None
    results = await each(handles, one, stop=stop, concurrency=concurrency)
    return [False if r is None else (None if r == "" else r) for r in results]
