"""Bulk operations: native when the driver declares it, emulated otherwise.

Emulated bulk follows the Ganga splitting design: with ``keep_going=False``
runs go one by one in index order and the first failure stops the rest
(they are reported as not attempted); with ``keep_going=True`` every run is
attempted, with at most ``concurrency`` in flight.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio

from .drivers import Driver, RunHandle, RunSpec, StatusUpdate, SubmitError, SubmitOutcome

T = TypeVar("T")
R = TypeVar("R")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SubmitError):
        return str(exc) or "submission refused"
    return f"{type(exc).__name__}: {exc}"


class Bulk:
    def __init__(self, concurrency: int) -> None:
        self.concurrency = max(1, int(concurrency))

    async def _each(self, items: Sequence[T], call: Callable[[T], Awaitable[R]], keep_going: bool,
                    failed: Callable[[R], bool]) -> list[R | None]:
        """``call`` each item; ``None`` for items never attempted."""
        results: list[R | None] = [None] * len(items)
        if not keep_going:
            for i, item in enumerate(items):
                results[i] = await call(item)
                if failed(results[i]):  # type: ignore[arg-type]
                    break
            return results
        limiter = anyio.CapacityLimiter(self.concurrency)

        async def one(i: int, item: T) -> None:
            async with limiter:
                results[i] = await call(item)

        async with anyio.create_task_group() as tg:
            for i, item in enumerate(items):
                tg.start_soon(one, i, item)
        return results

    async def submit(self, driver: Driver, runs: Sequence[RunSpec], keep_going: bool,
                     resubmit_of: dict[str, RunHandle] | None = None) -> tuple[list[SubmitOutcome | None], bool]:
        """Submit ``runs``; returns one outcome per run (``None``: not attempted) and whether it was native."""
        caps = driver.capabilities_for(runs[0].settings if runs else {})
        if caps.bulk_submit:
            try:
                outcomes = await driver.submit_bulk(runs)
            except Exception as exc:  # the whole call failed: nothing was submitted
                return [SubmitOutcome(r.fqid, None, _describe(exc)) for r in runs], False
            if len(outcomes) != len(runs):
                wrong = "driver answered the wrong number of outcomes"
                return [SubmitOutcome(r.fqid, None, wrong) for r in runs], False
            return list(outcomes), True

        async def one(run: RunSpec) -> SubmitOutcome:
            previous = (resubmit_of or {}).get(run.fqid)
            try:
                if previous is not None and caps.resubmit:
                    backend_id = await driver.resubmit(run, previous)
                else:
                    backend_id = await driver.submit(run)
            except Exception as exc:  # any driver failure leaves this run unsubmitted
                return SubmitOutcome(run.fqid, None, _describe(exc))
            return SubmitOutcome(run.fqid, backend_id)

        results = await self._each(runs, one, keep_going, lambda o: not o.ok)
        return list(results), False

    async def kill(self, driver: Driver, handles: Sequence[RunHandle], keep_going: bool) -> list[str | None | bool]:
        """One entry per handle: ``None`` killed, a message on failure, ``False`` not attempted."""
        if driver.capabilities_for(handles[0].settings if handles else {}).bulk_kill:
            try:
                return list(await driver.kill_bulk(handles))
            except Exception as exc:  # the bulk call failed as a whole
                return [_describe(exc)] * len(handles)

        async def one(h: RunHandle) -> str:
            try:
                await driver.kill(h)
            except Exception as exc:  # reported per run, the caller decides by keep_going
                return _describe(exc) or "kill failed"
            return ""

        results = await self._each(handles, one, keep_going, lambda r: r != "")
        return [False if r is None else (None if r == "" else r) for r in results]

    async def status(self, driver: Driver, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        if driver.capabilities_for(handles[0].settings if handles else {}).bulk_status:
            return list(await driver.status_bulk(handles))
        results = await self._each(handles, driver.status, True, lambda r: False)
        return [r for r in results if r is not None]

