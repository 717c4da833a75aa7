"""The state machine: ``handle(event) -> Step``. The one place where a job's status changes.

Synchronous and free of I/O, in the manner of Dask's
``WorkerState.handle_stimulus`` and h11's connection state: it is fed events
(requests, the runtime's outcomes, backends' reports) and answers each with
a :class:`~.step.Step` of changes, refusals and instructions for the runtime.
keep_going, native and emulated bulk with their rollbacks, the retry policy,
hold and release, the pre-job and aggregator gating and the masters'
statuses are all decided here, by one handler per event type; the runtime
carries out what it is told and reports back. Every rule is tested with no
loop, disk or backend, and a recorded sequence of events replays to the
same states.

Reading is free: ``status``, ``counts``, ``info`` and the rest answer from
the same compact tables (a master of a million subjobs is a few dozen
megabytes of arrays, and a count is a counter, never a scan).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

from . import monitoring, outcomes, records, requests, validate
from .base import Core
from .events import (
    AddRequested,
    Event,
    ForceStatusRequested,
    KillOutcomes,
    KillRequested,
    LinkedAdded,
    LookupOutcomes,
    MergeRequested,
    PostprocessDone,
    Prepared,
    PrepareFailed,
    Profile,
    ReleaseRequested,
    RemoveRequested,
    ResubmitRequested,
    RetryDue,
    RunLost,
    RunsSilent,
    Started,
    StatusReport,
    SubmitOutcomes,
    SubmitRequested,
)
from .ids import FQID
from .jobs import JobState
from .records import RunArrays, StoredJob
from .statuses import ACTIVE, MONITORED, JobStatus, master_status
from .step import Step
from .table import RunExtra, RunTable

Handler = Callable[[Core, Any], None]

HANDLERS: dict[type[Event], Handler] = {
    AddRequested: requests.handle_add,
    SubmitRequested: requests.handle_request,
    KillRequested: requests.handle_request,
    ResubmitRequested: requests.handle_request,
    ReleaseRequested: requests.handle_request,
    ForceStatusRequested: requests.handle_request,
    RemoveRequested: requests.handle_request,
    MergeRequested: requests.handle_request,
    Prepared: outcomes.handle_prepared,
    PrepareFailed: outcomes.handle_prepare_failed,
    SubmitOutcomes: outcomes.handle_submit_outcomes,
    KillOutcomes: outcomes.handle_kill_outcomes,
    LookupOutcomes: outcomes.handle_lookup_outcomes,
    LinkedAdded: outcomes.handle_linked_added,
    PostprocessDone: outcomes.handle_postprocess_done,
    StatusReport: monitoring.handle_status_report,
    RunLost: monitoring.handle_run_lost,
    RunsSilent: monitoring.handle_runs_silent,
    RetryDue: monitoring.handle_retry_due,
    Started: monitoring.handle_started,
}


class StateMachine:
    """Every job of one orchestrator home; see the module docstring.

    ``order`` is docs/design.md's ``master_status_order``.
    """

    def __init__(self, order: str = "submitted-first", *, lost_after: float = 600.0) -> None:
        master_status({}, order)  # validates the setting once, up front
        self._core = Core(order, lost_after)

    # ------------------------------------------------------------ stimuli
    def handle(self, event: Event) -> Step:
        """Apply one event; return what it changed and what the runtime must do."""
        core = self._core
        core.begin(event)
        handler = HANDLERS.get(type(event))
        if handler is None:
            raise TypeError(f"the state machine has no handler for {type(event).__name__}")
        handler(core, event)
        return core.step

    # ------------------------------------------------------------ loading
    def load(self, job_id: int, profile: Profile, *, created: float, table: RunTable | None = None,
             top: dict[str, Any] | None = None, partition: dict[str, Any] | None = None, attempt: int = 0,
             link: tuple[int, str] | None = None, post_failed: bool = False, merged_at: float = 0.0,
             master: bool = False) -> None:
        """Restore one top-level job as the repository stored it (``table``: its runs, a master's subjobs
        when ``master``)."""
        js = JobState(job_id, profile, created, self._core.order)
        if table is not None:
            js.runs = table
        js.is_master = master and table is not None and len(table) > 0
        js.top = RunExtra.from_dict(top or {})
        js.top.timestamps.setdefault("new", created)
        js.partition = dict(partition or {})
        js.attempt = attempt
        js.link = link
        js.post_failed = post_failed
        js.merged_at = merged_at
        if js.is_master:
            js.derived = js.derive()
            phase = js.partition.get("phase")
            if phase in ("starting", "prejob", "aggregator"):
                js.pinned = JobStatus.SUBMITTED  # shows its linked job's status again once that one reports
        self._core.jobs[job_id] = js

    def forget(self, job_id: int) -> None:
        self._core.jobs.pop(job_id, None)

    # ------------------------------------------------------------ queries
    def __contains__(self, fq: FQID) -> bool:
        return self._core.job_of(fq) is not None

    def job_ids(self) -> list[int]:
        return sorted(self._core.jobs)

    def status(self, fq: FQID) -> JobStatus:
        if self._core.job_of(fq) is None:
            raise KeyError(f"no job {'.'.join(map(str, fq))}")
        return self._core.status_of(fq)

    def status_if_known(self, fq: FQID) -> JobStatus | None:
        """``status(fq)``, or ``None`` for a job that does not exist (one look-up: monitoring asks per run)."""
        return self._core.status_of(fq) if self._core.job_of(fq) is not None else None

    def profile(self, job_id: int) -> Profile:
        return self._core.jobs[job_id].profile

    def is_master(self, job_id: int) -> bool:
        js = self._core.jobs.get(job_id)
        return js is not None and js.is_master

    def n_subjobs(self, job_id: int) -> int:
        js = self._core.jobs[job_id]
        return len(js.runs) if js.is_master else 0

    def counts(self, job_id: int) -> dict[JobStatus, int]:
        """A master's subjobs per status, from its counters."""
        return self._core.jobs[job_id].counts()

    def statuses(self, job_id: int) -> bytes:
        """A master's subjob status codes, by index (one byte each)."""
        js = self._core.jobs[job_id]
        return bytes(js.runs.status) if js.is_master else b""

    def indexes(self, job_id: int, statuses: Iterable[JobStatus]) -> list[int]:
        js = self._core.jobs[job_id]
        return js.runs.indexes_in(statuses) if js.is_master else []

    def active(self, fq: FQID, *, postprocess: bool = True) -> bool:
        """Something of the job is submitting, submitted, running or completing (or post-processing)."""
        js = self._core.job_of(fq)
        if js is None:
            return False
        if len(fq) == 2:
            return js.runs.get(fq[1]) in ACTIVE
        return js.active(postprocess=postprocess)

    def busy(self, job_id: int) -> bool:
        """A request on the job is under way (or waits)."""
        core = self._core
        return job_id in core.busy or any(job_id in {t[0] for t in e.targets} for e, _ in core.waiting)

    def attempt(self, fq: FQID) -> int:
        js = self._core.jobs[fq[0]]
        if len(fq) == 1 and js.is_master:
            return js.attempt
        return js.runs.attempt[fq[1] if len(fq) == 2 else 0]

    def retry_args(self, fq: FQID) -> list[str]:
        js = self._core.jobs[fq[0]]
        extra = js.runs.extras.get(fq[1] if len(fq) == 2 else 0)
        return list(extra.retry_args) if extra is not None else []

    def info(self, fq: FQID) -> dict[str, Any]:
        """The job's public ``info``: counters, timestamps, reasons, history, retry args, links."""
        js = self._core.jobs[fq[0]]
        if len(fq) == 1 and js.is_master:
            out = js.top.to_dict()
            out["timestamps"] = dict(js.top.timestamps)
            out["submit_counter"] = js.attempt
        else:
            i = fq[1] if len(fq) == 2 else 0
            extra = js.runs.extras.get(i)
            out = extra.to_dict() if extra is not None else {}
            out["timestamps"] = {"new": js.created, **js.runs.timestamps(i)}
            out["submit_counter"] = js.runs.attempt[i]
            if len(fq) == 1 and js.top.reason and not out.get("reason"):
                out["reason"] = js.top.reason
        if len(fq) == 1:
            partition = dict(js.partition)
            if js.link is not None:
                partition.update(master=js.link[0], role=js.link[1])
            if partition:
                out["partition"] = partition
        return out

    # ------------------------------------------------------------ narrow reads for views and the runtime
    def created(self, job_id: int) -> float:
        return self._core.jobs[job_id].created

    def attempts(self, job_id: int, indexes: Iterable[int] | None) -> tuple[int, ...]:
        """The attempts of these runs now (``None``: the job's own run)."""
        table = self._core.jobs[job_id].runs.attempt
        return (table[0],) if indexes is None else tuple(table[i] for i in indexes)

    def newest_history(self, job_id: int, indexes: Iterable[int] | None) -> list[Mapping[str, Any]]:
        """Each run's newest history entry (what was just judged of it), for the runs that have one."""
        extras = self._core.jobs[job_id].runs.extras
        out: list[Mapping[str, Any]] = []
        for i in indexes if indexes is not None else [0]:
            extra = extras.get(i)
            if extra is not None and extra.history:
                out.append(extra.history[-1])
        return out

    def checkpoint(self, fq: FQID) -> Mapping[str, Any]:
        """The record of the run's newest saved checkpoint state (empty: none)."""
        extra = self._core.jobs[fq[0]].runs.extras.get(fq[1] if len(fq) == 2 else 0)
        return extra.checkpoint if extra is not None else {}

    def checkpointed(self, job_id: int) -> list[int]:
        """The runs of a job that saved a checkpoint state (index 0 for a job that runs itself)."""
        return sorted(self._core.jobs[job_id].runs.saved)

    def submitting_anywhere(self) -> bool:
        """Is a run of any job on its way to a backend (a retry under way)?"""
        code = JobStatus.SUBMITTING.code
        return any(js.runs.counts[code] for js in self._core.jobs.values())

    def monitored(self, job_id: int) -> list[int]:
        """The runs a backend has (submitted, running, completing, held): the ones to watch again on a restart."""
        return self._core.jobs[job_id].runs.indexes_in(MONITORED)

    def reasons(self, job_id: int, indexes: Iterable[int]) -> list[str | None]:
        extras = self._core.jobs[job_id].runs.extras
        return [extras[i].reason if i in extras else None for i in indexes]

    def final_times(self, job_id: int) -> Sequence[float]:
        """When each run of a master ended (0: not yet)."""
        return self._core.jobs[job_id].runs.times["final"]

    def stored_job(self, job_id: int) -> StoredJob:
        """The job's own row as the repository stores it (:mod:`.records`)."""
        return records.stored_job(self._core.jobs[job_id])

    def run_arrays(self, job_id: int) -> RunArrays:
        """The job's run arrays as the repository stores them."""
        return records.run_arrays(self._core.jobs[job_id])

    def run_infos(self, job_id: int, indexes: AbstractSet[int] | None) -> dict[int, dict[str, Any]]:
        """The stored extras of a master's subjobs among ``indexes`` (``None``: all) that hold anything."""
        return records.run_infos(self._core.jobs[job_id], indexes)

    def job_state(self, job_id: int) -> JobState:
        """The job's whole state, read-only by contract: for the core's own tests, never the runtime (which
        reads the narrow answers above)."""
        return self._core.jobs[job_id]

    def mark_dirty(self, job_id: int, indexes: set[int] | None) -> None:
        """Mark runs of a job (``None``: all) as still to be written (a write that failed gives them back)."""
        if job_id in self._core.jobs:
            self._core.mark(job_id, indexes)

    def validate_state(self) -> None:
        """Check the core's own invariants (counters, derived statuses, links, requests under way); raise
        :class:`~.validate.InvalidState` naming the job and what disagrees. On demand, as Dask's
        ``validate_state()``: the property test calls it after every step; nothing in production does."""
        validate.validate(self._core)

    def take_dirty(self) -> tuple[dict[int, set[int] | None], set[int]]:
        """What changed since the last call: the runtime's writer takes it at each flush."""
        return self._core.take_dirty()


__all__ = ["HANDLERS", "StateMachine"]
