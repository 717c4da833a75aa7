"""Pre-job and aggregator around a partitioned job: DataGrid's DAG, pre-job -> subjobs -> aggregator.

Design, chosen as the least invasive: the pre-job and the aggregator run as
separate top-level jobs, linked from the master's ``info.partition``
(``prejob``, ``aggregator``: their ids) and back (``master``, ``role``).
Subjob ids stay ``0..N-1``, the state machine and its counters are
untouched, and both are ordinary jobs a user can look at, kill, resubmit and
fetch states of. The master's status keeps DESIGN.md's rules with the
linked job counted as one more run: while the pre-job is active every
subjob is ``new``, while the aggregator is active every subjob is final, so
rules 1 and 2 come down to the linked job's status, which the master shows
through the state machine's pin (the mechanism that shows ``submitting``
during ``submit()``). Once the linked job ends the pin goes and the master
is derived again; an aggregator that failed, or was not started, fails the
master the way a failed merger does.

Phases, in ``master.info.partition["phase"]``:

- ``prejob``: the pre-job runs; the subjobs are split (so ``submit()``
  still reports every splitting error) but left ``new``. When it completes
  they are submitted (``subjobs``); if it ends otherwise, after its own
  retries, the master fails and no subjob starts (``prejob-ended``).
  Resubmitting the pre-job starts the phase again.
- ``subjobs``: the subjobs run.
- ``aggregator``: every subjob ended. If fewer than ``min_success`` of them
  reached a final state (``set_final_state``), the aggregator is not
  started and the master fails with that reason; else it runs with the
  labels of the subjobs' final states as its steps, those states exported
  into its ``.orch-state/labels`` so that ``load_state(label)`` finds them.
- ``aggregator-ended``: the master is final; resubmitting subjobs runs the
  aggregator again once they end, resubmitting the aggregator reruns it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from .checkpoint import Steps
from .errors import JobError
from .job import Job
from .model import Backend
from .statemachine import Step
from .status import FINAL, JobStatus

if TYPE_CHECKING:
    from .engine import Engine

S = JobStatus
#: What the master shows while its linked job is in each status (rules 1-3 with one run).
_SHOWN = {S.SUBMITTING: S.SUBMITTED, S.SUBMITTED: S.SUBMITTED, S.RUNNING: S.RUNNING, S.COMPLETING: S.RUNNING,
          S.HELD: S.HELD}


class Partitions:
    """The engine's pre-job / aggregator coordinator; see the module docstring."""

    def __init__(self, engine: Engine) -> None:
        self.e = engine
        #: linked job id -> (master id, role)
        self.links: dict[int, tuple[int, str]] = {}
        #: masters with a phase change under way (they count as active for ``wait()``)
        self.busy: dict[int, int] = {}

    def is_busy(self, master_id: int) -> bool:
        return self.busy.get(master_id, 0) > 0

    def free_slots(self, backend: Backend) -> int:
        """Runs ``backend`` could start now (``StepSplitter()``'s m): its ``max_running`` less the runs under way."""
        capacity = self.e.config.backend(backend.name).get("max_running")
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            capacity = self.e.checkpoints.default_partitions
        return max(capacity - len(self.e.active.get(backend.name, {})), 1)

    # -------------------------------------------------------------- life
    def start(self) -> None:
        """After a reopen: find the links, show linked jobs on their masters, carry on phases left midway."""
        for job_id, job in self.e.jobs.items():
            p = job.info.partition
            if "master" in p:
                self.links[job_id] = (int(p["master"]), str(p["role"]))
        for job_id, job in list(self.e.jobs.items()):
            phase = job.info.partition.get("phase")
            if phase == "starting":  # closed while the pre-job was being submitted
                phase = job.info.partition["phase"] = "prejob"
            if phase in ("prejob", "aggregator"):
                linked = self.linked(job, phase)
                if linked is not None and (linked.status in FINAL or linked.status == S.NEW):
                    self._spawn(job_id, self._after_linked(job_id, phase))
                elif linked is not None:
                    self._mirror(job_id, linked.status)
            elif job._aggregator is not None and self.e.sm.is_master(job_id) and self._aggregation_due(job):
                self.master_ended(job_id)

    def forget(self, job_id: int) -> None:
        self.links = {k: v for k, v in self.links.items() if v[0] != job_id and k != job_id}

    def linked(self, master: Job, role: str) -> Job | None:
        job_id = master.info.partition.get(role)
        return self.e.jobs.get(job_id) if job_id is not None else None

    def active_linked(self, master: Job) -> list[Job]:
        """The master's pre-job or aggregator while it is killable (a master's kill ends it too)."""
        return [j for role in ("prejob", "aggregator") if (j := self.linked(master, role)) is not None
                and j.status in (S.SUBMITTED, S.RUNNING, S.HELD)]

    def check_resubmit(self, master: Job) -> None:
        """Resubmitting the subjobs makes no sense while the pre-job runs or after it failed."""
        phase = master.info.partition.get("phase")
        prejob = self.linked(master, "prejob")
        if phase in ("starting", "prejob") and prejob is not None:
            raise JobError(f"its prejob {prejob.fqid} is {prejob.status.value}: the subjobs start once it completes",
                           fqid=master.fqid)
        if phase == "prejob-ended" and prejob is not None:
            raise JobError(f"its prejob {prejob.fqid} {prejob.status.value}: resubmit the prejob "
                           f"(the subjobs start once it completes)", fqid=master.fqid)

    def postprocess_failed(self, master: Job, merger_failed: bool) -> bool:
        """The master's post-processing verdict: its merger's and its aggregator's together."""
        p = master.info.partition
        if not p:
            return merger_failed
        p["merger_failed"] = merger_failed
        return merger_failed or bool(p.get("failed"))

    # ------------------------------------------------------------ observe
    def observe(self, step: Step) -> None:
        """Each status change of a linked job: show it on the master, or act once it ended."""
        if not self.links:
            return
        for ch in step.changes:
            if len(ch.fqid) != 1 or ch.fqid[0] not in self.links:
                continue
            mid, role = self.links[ch.fqid[0]]
            master = self.e.jobs.get(mid)
            if master is None or not self.e.sm.is_master(mid):
                continue
            p = master.info.partition
            if p.get("phase") == f"{role}-ended" and ch.new == S.SUBMITTING:
                p["phase"] = role  # the user resubmitted the pre-job or the aggregator: its phase again
                self.e.mark_dirty(master)
            if p.get("phase") != role:
                continue
            if ch.new in FINAL or ch.new == S.NEW:
                self._spawn(mid, self._after_linked(mid, role))
            else:
                self._mirror(mid, ch.new)

    def master_ended(self, master_id: int) -> None:
        """Every subjob of a master is final: its aggregator is due (if it has one)."""
        master = self.e.jobs.get(master_id)
        if master is not None and master._aggregator is not None and \
                master.info.partition.get("phase") != "aggregator":
            self._spawn(master_id, self._aggregate(master_id))

    # ------------------------------------------------------------- pre-job
    async def start_prejob(self, master: Job) -> None:
        """Add and submit the pre-job; the subjobs wait (``new``). On error nothing of it is left."""
        assert master.id is not None and master._prejob is not None
        mid = master.id
        prejob = await self._add(master, master._prejob, "prejob")
        master.info.partition.update(prejob=prejob.id, phase="starting")
        try:
            await self.e.ops.submit(prejob)
        except BaseException:
            self.forget(prejob.fqid_tuple[0])
            await self.e.ops.remove(prejob)
            raise
        master.info.partition["phase"] = "prejob"
        if prejob.status in FINAL:
            self._spawn(mid, self._after_linked(mid, "prejob"))
        else:
            self._mirror(mid, prejob.status)

    async def _prejob_ended(self, master: Job, prejob: Job) -> None:
        assert master.id is not None
        p = master.info.partition
        if prejob.status == S.COMPLETED:
            p["phase"] = "subjobs"
            indexes = self.e.sm.subjob_ids(master.id, [S.NEW])
            subjobs = self.e.materialize(master, indexes)
            self.e.move([s.fqid_tuple for s in subjobs], S.SUBMITTING)
            failures = await self.e.ops._submit_runs(subjobs, keep_going=True, on_reject=None)
            if failures and all(s.status == S.NEW for s in subjobs):
                master.info.reason = f"no subjob could be submitted after the prejob; first error: {failures[0][1]}"
            else:
                master.info.reason = None
        else:
            p["phase"] = "prejob-ended"
            why = f": {prejob.info.reason}" if prejob.info.reason else ""
            master.info.reason = f"prejob {prejob.fqid} {prejob.status.value}{why}; no subjob was started"
        self.e.mark_dirty(master)
        self._unpin(master)

    # ---------------------------------------------------------- aggregator
    def _aggregation_due(self, master: Job) -> bool:
        assert master.id is not None
        state = self.e.sm.master(master.id)
        return state.all_final() and float(master.info.partition.get("aggregated", 0.0)) < state.last.get(
            "final", 0.0)

    async def _aggregate(self, mid: int) -> None:
        master = self.e.jobs.get(mid)
        if master is None or master._aggregator is None:
            return
        async with self.e.lock(master):
            if not self.e.sm.is_master(mid) or not self._aggregation_due(master):
                return
            p = master.info.partition
            p.update(aggregated=time.time(), failed=False)
            n = len(self.e.sm.master(mid).statuses)
            subjobs = self.e.materialize(master, range(n))
            labels = [s.info.checkpoint["label"] for s in subjobs if s.info.checkpoint.get("final")]
            self.e.mark_dirty(master)
            if len(labels) < master.min_success * n - 1e-9:
                self._fail(master, f"only {len(labels)} of {n} subjobs reached a final state "
                                   f"(min_success={master.min_success:g}); the aggregator was not started")
                return
            aggregator = self.linked(master, "aggregator")
            try:
                if aggregator is None:
                    aggregator = await self._add(master, master._aggregator, "aggregator", steps=labels)
                    p["aggregator"] = aggregator.id
                else:  # a later round (subjobs resubmitted): the same job, with the new labels
                    aggregator.steps = labels
                    self.e.mark_dirty(aggregator, spec=True)
                if aggregator.status == S.NEW:
                    await self.e.ops.submit(aggregator)
                else:
                    await self.e.ops.resubmit_job(aggregator, only_failed=False)
            except JobError as exc:
                self._fail(master, f"the aggregator could not be submitted: {exc}")
                return
            p["phase"] = "aggregator"
            if aggregator.status in FINAL:
                self._spawn(mid, self._after_linked(mid, "aggregator"))
            else:
                self._mirror(mid, aggregator.status)
            await self.e.flush()

    def _aggregator_ended(self, master: Job, aggregator: Job) -> None:
        p = master.info.partition
        p["phase"] = "aggregator-ended"
        if aggregator.status == S.COMPLETED:
            p["failed"] = False
            if not p.get("merger_failed"):
                master.info.reason = None
            self.e.mark_dirty(master)
            self._unpin(master)
        else:
            why = f": {aggregator.info.reason}" if aggregator.info.reason else ""
            self._fail(master, f"aggregator {aggregator.fqid} {aggregator.status.value}{why}")

    def _fail(self, master: Job, reason: str) -> None:
        p = master.info.partition
        p.update(failed=True, phase="aggregator-ended")
        master.info.reason = reason
        self.e.mark_dirty(master)
        self.e.log.warning("partitioned job failed", fqid=master.fqid, reason=reason)
        self._unpin(master)

    # ------------------------------------------------------------- helpers
    async def _after_linked(self, mid: int, role: str) -> None:
        """A linked job ended (or was left unsubmitted by a restart): move the master's phase on."""
        master = self.e.jobs.get(mid)
        if master is None:
            return
        async with self.e.lock(master):
            linked = self.linked(master, role)
            if master.info.partition.get("phase") != role:
                return
            if linked is None:  # removed by the user meanwhile: the phase cannot go on
                master.info.partition["phase"] = f"{role}-ended"
                if role == "aggregator":
                    self._fail(master, "the aggregator was removed")
                else:
                    master.info.reason = "the prejob was removed; no subjob was started"
                    self._unpin(master)
                await self.e.flush()
                return
            if linked.status == S.NEW:  # its submission was cut short by a restart
                try:
                    await self.e.ops.submit(linked)
                except JobError as exc:
                    linked.info.reason = str(exc)
            if linked.status not in FINAL and linked.status != S.NEW:
                self._mirror(mid, linked.status)  # retried meanwhile
                return
            if role == "prejob":
                await self._prejob_ended(master, linked)
            else:
                self._aggregator_ended(master, linked)
            await self.e.flush()

    async def _add(self, master: Job, definition: Job, role: str, steps: list[str] | None = None) -> Job:
        twin = definition.template()
        twin.name = definition.name or f"{master.name or 'job'}-{role}"
        if steps is not None:
            twin.steps = steps
        job = await self.e.ops.add(twin)
        assert job.id is not None and master.id is not None
        job.info.partition = {"master": master.id, "role": role}
        self.links[job.id] = (master.id, role)
        self.e.mark_dirty(job)
        return job

    def _mirror(self, mid: int, status: JobStatus) -> None:
        shown = _SHOWN.get(status)
        if shown is not None and self.e.sm.is_master(mid) and self.e.sm.master(mid).pinned != shown:
            self.e.apply(self.e.sm.pin(mid, shown, time.time()))

    def _unpin(self, master: Job) -> None:
        """Derive the master's status again, with the post-processing verdict (merger and aggregator)."""
        assert master.id is not None
        mid = master.id
        now = time.time()
        p = master.info.partition
        self.e.apply(self.e.sm.set_postprocess_failed(mid, bool(p.get("failed") or p.get("merger_failed")), now))
        step = self.e.sm.pin(mid, None, now)
        step.ended.clear()  # the subjobs ended before: their merger and aggregator were taken care of
        self.e.apply(step)

    def _spawn(self, mid: int, work: Awaitable[None]) -> None:
        """Run a phase change in the engine's task group; the master counts as active until it is done."""
        assert self.e._tg is not None
        self.busy[mid] = self.busy.get(mid, 0) + 1

        async def run() -> None:
            try:
                await work
            except Exception as exc:  # a bug here must not bring the orchestrator down
                self.e.log.exception("partition phase failed", fqid=str(mid), error=repr(exc))
            finally:
                self.busy[mid] -= 1
                if not self.busy[mid]:
                    del self.busy[mid]
                self.e.notify()

        self.e._tg.start_soon(run)


def validate_partition(job: Job, fqid: str, validate_job: Callable[[Job, str], None]) -> None:
    """Check steps, their weights, a pre-job and an aggregator at ``add()`` (``JobError`` names the field)."""
    n = 0
    if job.steps is not None:
        try:
            steps = Steps(job.steps)
        except (TypeError, ValueError) as exc:
            raise JobError(str(exc), fqid=fqid, field="steps") from None
        job.steps = steps.spec() if steps.range is not None else list(steps.labels or [])
        n = len(steps)
    if job.step_weights is not None:
        if job.steps is None:
            raise JobError("step weights need steps", fqid=fqid, field="step_weights")
        weights = job.step_weights
        if isinstance(weights, (str, bytes)) or len(weights) != n:
            raise JobError(f"must be a list of {n} numbers, one per step", fqid=fqid, field="step_weights")
        for w in weights:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise JobError(f"{w!r} is not a number >= 0", fqid=fqid, field="step_weights")
    for role in ("prejob", "aggregator"):
        definition = getattr(job, f"_{role}")
        if definition is None:
            continue
        if not isinstance(definition, Job) or definition._engine is not None:
            raise JobError(f"{role} must be a new Job(...), not {definition!r}", fqid=fqid, field=role)
        if job.splitter is None:
            raise JobError(f"a {role} needs a partitioned job (one with a splitter)", fqid=fqid, field=role)
        if definition.splitter is not None or definition._prejob is not None or definition._aggregator is not None:
            raise JobError(f"the {role} cannot have a splitter, a prejob or an aggregator of its own", fqid=fqid,
                           field=role)
        validate_job(definition, f"{fqid} ({role})")
    ms = job.min_success
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms <= 1:
        raise JobError(f"must be a fraction between 0 and 1, not {ms!r}", fqid=fqid, field="min_success")


__all__ = ["Partitions", "validate_partition"]
