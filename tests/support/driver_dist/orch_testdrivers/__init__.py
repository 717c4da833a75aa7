"""Backends for the tests, registered as any third party's are: by the entry points of an installed
distribution (``orch_testdrivers-0.1.dist-info`` beside this package, put on ``sys.path`` by the
``test_drivers`` fixture of ``tests/support/testdriver.py``).

- ``chatty``: ``sim``, saying in its own log lines what it is asked to do (submit, kill, status), so a
  test can see whose request a driver's line belongs to.
- ``stalling``: ``sim``, whose submissions wait while a file ``stall`` is in its state dir (a backend that
  takes its time), and whose metrics say how many submission calls are under way.
- ``limbo``: ``local``, whose status answers for a run's first attempt are nonsense: the runtime hears
  nothing intelligible of it, declares it lost after ``lost_after_seconds`` while its process still
  lives, and retries it; later attempts are answered as ``local`` answers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
from orch_local import LocalDriver
from orch_sim import SimDriver

from orchestrator.plugin import DriverContext, RunHandle, RunSpec, StatusUpdate, SubmitOutcome


class ChattyDriver(SimDriver):
    name = "chatty"

    async def submit_bulk(self, runs: Sequence[RunSpec]) -> list[SubmitOutcome]:
        self.context.log.info("driver submits", runs=[r.fqid for r in runs])
        return await super().submit_bulk(runs)

    async def submit(self, run: RunSpec) -> str:
        self.context.log.info("driver submits", runs=[run.fqid])
        return await super().submit(run)

    async def kill_bulk(self, handles: Sequence[RunHandle]) -> list[str | None]:
        self.context.log.info("driver kills", runs=[h.fqid for h in handles])
        return await super().kill_bulk(handles)

    async def kill(self, handle: RunHandle) -> None:
        self.context.log.info("driver kills", runs=[handle.fqid])
        await super().kill(handle)

    async def status_bulk(self, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        self.context.log.info("driver is asked", runs=[h.fqid for h in handles])
        return await super().status_bulk(handles)


class StallingDriver(SimDriver):
    name = "stalling"

    def __init__(self, context: DriverContext) -> None:
        super().__init__(context)
        self.stall = context.statedir / "stall"
        self.under_way = 0

    async def submit_bulk(self, runs: Sequence[RunSpec]) -> list[SubmitOutcome]:
        self.under_way += 1
        try:
            while self.stall.exists():
                await anyio.sleep(0.02)
            return await super().submit_bulk(runs)
        finally:
            self.under_way -= 1

    def metrics(self) -> dict[str, Any]:
        return {**super().metrics(), "under_way": self.under_way}


class LimboDriver(LocalDriver):
    name = "limbo"

    async def status_bulk(self, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        first = [h for h in handles if h.attempt == 1]
        later = [h for h in handles if h.attempt != 1]
        answers = await super().status_bulk(later) if later else []
        return [*answers, *(StatusUpdate(h.fqid, "in limbo") for h in first)]  # type: ignore[arg-type]
