"""Backends for the tests, registered as any third party's are: by the entry points of an installed
distribution (``orch_testdrivers-0.1.dist-info`` beside this package, put on ``sys.path`` by the
``test_drivers`` fixture of ``tests/support/testdriver.py``).

- ``chatty``: ``sim``, saying in its own log lines what it is asked to do (submit, kill, status), so a
  test can see whose request a driver's line belongs to.
- ``stalling``: ``sim``, whose submissions wait while a file ``stall`` is in its state dir (a backend that
  takes its time), and whose metrics say how many submission calls are under way.
- ``bulkonly``: written with the bulk forms only (``submit_bulk``, ``kill_bulk``, ``status_bulk``) and
  declaring no bulk capability, so the runtime calls the single-run forms the SDK derives from them. A run
  whose first argument is ``hang`` runs until killed; any other completes at its first status query. One whose
  first argument is ``mangle`` is answered with a backend id holding a lone surrogate; one whose first argument
  is ``garble`` is reported failed with a ``bytes`` reason and an exit code of 31 digits; one whose first argument
  is ``babble``, failed with a reason of a mebibyte; one whose first argument is ``chatter`` is refused with a
  ``SubmitError`` of a mebibyte.
- ``hollow``: implements neither form of submit nor of kill: refused when loaded.
- ``limbo``: ``local``, whose word on a run's first attempt is nonsense: the runtime hears
  nothing intelligible of it, declares it lost after ``lost_after_seconds`` while its process still
  lives, and retries it; later attempts are answered as ``local`` answers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
from orch_local import LocalDriver
from orch_sim import SimDriver

from orchestrator.plugin import (
    Capabilities,
    Driver,
    DriverContext,
    JobStatus,
    RunHandle,
    RunSpec,
    StatusUpdate,
    SubmitOutcome,
)


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


class BulkOnlyDriver(Driver):
    name = "bulkonly"
    capabilities = Capabilities()  # polled, and every call emulated run by run

    def __init__(self, context: DriverContext) -> None:
        super().__init__(context)
        self.runs: dict[str, JobStatus] = {}
        #: The size of every bulk call, by method.
        self.sizes: dict[str, list[int]] = {"submit_bulk": [], "kill_bulk": [], "status_bulk": []}

    async def submit_bulk(self, runs: Sequence[RunSpec]) -> list[SubmitOutcome]:
        self.sizes["submit_bulk"].append(len(runs))
        # a run whose first argument is "mangle" is answered with an id no repository can store (a driver that
        # decoded it from a batch system's bytes with ``surrogateescape``)
        ids = [f"{run.key}-\udcff" if run.args[:1] == ("mangle",) else
               f"{run.key}-{run.args[0]}" if run.args[:1] in (("garble",), ("babble",)) else run.key for run in runs]
        for run, backend_id in zip(runs, ids, strict=True):
            hangs = bool(run.args) and run.args[0] == "hang"
            self.runs[backend_id] = JobStatus.RUNNING if hangs else JobStatus.COMPLETED
        await anyio.lowlevel.checkpoint()
        return [SubmitOutcome(run.fqid, None, "chatter " * (1 << 17)) if run.args[:1] == ("chatter",) else
                SubmitOutcome(run.fqid, backend_id) for run, backend_id in zip(runs, ids, strict=True)]

    async def kill_bulk(self, handles: Sequence[RunHandle]) -> list[str | None]:
        self.sizes["kill_bulk"].append(len(handles))
        for h in handles:
            self.runs[h.backend_id] = JobStatus.KILLED
        await anyio.lowlevel.checkpoint()
        return [None] * len(handles)

    async def status_bulk(self, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        self.sizes["status_bulk"].append(len(handles))
        await anyio.lowlevel.checkpoint()
        return [StatusUpdate(h.fqid, JobStatus.FAILED, exit_code=10**30, reason=b"garbled")  # type: ignore[arg-type]
                if h.backend_id.endswith("-garble") else
                StatusUpdate(h.fqid, JobStatus.FAILED, exit_code=1, reason="babble " * (1 << 17))
                if h.backend_id.endswith("-babble") else StatusUpdate(h.fqid, self.runs[h.backend_id], exit_code=0)
                for h in handles if self.runs.get(h.backend_id, h.status) != h.status]

    def metrics(self) -> dict[str, Any]:
        return {"sizes": {k: list(v) for k, v in self.sizes.items()}}


class HollowDriver(Driver):
    name = "hollow"

    async def status_bulk(self, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        return []


class LimboDriver(LocalDriver):
    """``local`` (a reporting driver) whose word on a run's first attempt is replaced by nonsense, said every
    0.1 s: the runtime hears nothing intelligible of that attempt and declares it lost."""

    name = "limbo"

    def __init__(self, context: DriverContext) -> None:
        super().__init__(context)
        self.first: set[str] = set()

    async def submit(self, run: RunSpec) -> str:
        (self.first.add if run.attempt == 1 else self.first.discard)(run.fqid)
        return await super().submit(run)

    async def serve(self) -> None:
        said = self.context.report  # the runtime's, set before serve() starts

        async def filtered(updates: Sequence[StatusUpdate]) -> None:
            kept = [u for u in updates if u.fqid not in self.first]
            if kept:
                await said(kept)

        self.context.report = filtered
        async with anyio.create_task_group() as tg:
            tg.start_soon(super().serve)
            while True:
                await anyio.sleep(0.1)
                if self.first:
                    await said([StatusUpdate(f, "in limbo") for f in sorted(self.first)])  # type: ignore[arg-type]
