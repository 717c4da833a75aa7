"""After a restart: settle every run caught between ``submitting`` and ``submitted``.

A subjob is written to the repository as ``submitting`` (with its attempt
counter, hence its idempotency key ``RunSpec.key``) before any driver is
asked to submit it; the backend id is written after. A crash in between
leaves the repository saying ``submitting`` while the backend may or may not
have the run. On start each such run is looked up at its backend by its key:

- found: adopted, ``submitted`` with the backend's id, and monitored;
- not found: the backend never got it, so it is sent again under the same
  key: the submission the user asked for is carried out, once;
- the driver cannot look runs up (no ``lookup`` capability): the run goes
  back to ``new`` with the reason, for the user to resubmit, since sending it
  again might start it twice; an automatic retry caught mid-way is carried
  on as before (its earlier attempt had ended).

A backend that cannot be asked now (the lookup raises) is asked again every
poll interval; its runs stay ``submitting`` meanwhile, so nothing is sent.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import anyio

from .ids import FQID, fqid_str
from .job import Job
from .runspec import build_run_spec
from .status import JobStatus

if TYPE_CHECKING:
    from .engine import Engine

S = JobStatus


class Reconciler:
    def __init__(self, engine: Engine) -> None:
        self.e = engine
        #: Runs still waiting for their backend to answer a lookup, by backend name.
        self.pending: dict[str, list[FQID]] = {}

    @property
    def busy(self) -> bool:
        return any(self.pending.values())

    async def start(self, interrupted: Sequence[FQID]) -> None:
        """Sort the runs left ``submitting``; look them up where the driver can."""
        e = self.e
        rollback: list[FQID] = []
        retrying: list[FQID] = []
        for fq in interrupted:
            job = e.lookup(fq)
            driver = await e.driver(job.backend.name)
            if driver.capabilities_for(job.backend.settings).lookup:
                self.pending.setdefault(job.backend.name, []).append(fq)
            elif (h := job.info.history) and h[-1].get("action") == "retry":
                retrying.append(fq)
            else:
                rollback.append(fq)
        if rollback:
            for fq in rollback:
                e.lookup(fq).info.reason = "submission interrupted by a restart; the backend cannot say whether it " \
                                           "got it: check, then resubmit"
            e.log.warning("submission interrupted by a restart; left new", jobs=[fqid_str(f) for f in rollback])
            e.move(rollback, S.NEW)
        if retrying:
            e._start_retries(retrying)
        for name in list(self.pending):
            await self.settle(name)

    async def settle(self, name: str) -> bool:
        """Ask backend ``name`` about its pending runs once; ``True`` when it answered."""
        e = self.e
        fqids = [fq for fq in self.pending.get(name, []) if e.sm.status(fq) == S.SUBMITTING]
        if not fqids:
            self.pending.pop(name, None)
            return True
        jobs = [e.lookup(fq) for fq in fqids]
        driver = await e.driver(name)
        specs = [build_run_spec(j, e.workspace, e.home_key, e.checkpoints.env()) for j in jobs]
        try:
            found = await driver.lookup(specs)
            if len(found) != len(specs):
                raise RuntimeError(f"lookup answered {len(found)} ids for {len(specs)} runs")
        except Exception as exc:  # the backend's fault: its runs stay submitting, it is asked again
            e.log.warning("lookup of interrupted submissions failed; will ask again", backend=name,
                          error=repr(exc), fqid=",".join(sorted({str(fq[0]) for fq in fqids})))
            return False
        self.pending.pop(name, None)
        adopted: list[Job] = []
        again: list[FQID] = []
        for job, backend_id in zip(jobs, found, strict=True):
            if backend_id:
                job.backend_id = backend_id
                adopted.append(job)
            else:
                again.append(job.fqid_tuple)
        if adopted:
            e.log.info("interrupted submissions found at the backend: adopted", backend=name,
                       jobs=[j.fqid for j in adopted][:50], count=len(adopted))
            e.move([j.fqid_tuple for j in adopted], S.SUBMITTED, time.time())
        if again:
            e.log.info("interrupted submissions never reached the backend: sent again", backend=name,
                       jobs=[fqid_str(f) for f in again][:50], count=len(again))
            e._start_retries(again)
        await e.flush()
        return True

    async def run(self) -> None:
        """Ask backends that could not answer at start again, every poll interval."""
        interval = float(self.e.config.core["poll_interval"])
        while True:
            await anyio.sleep(interval)
            for name in [n for n, runs in self.pending.items() if runs]:
                await self.settle(name)
