"""Events: everything that changes a job enters the core as one of these.

Each event is immutable, carries a batch of job ids (bulk first: one subjob
is a batch of one) and a ``stimulus_id`` that follows it into every change
and instruction it causes, and from an instruction into the driver's report
on it. ``time`` is the wall-clock time the event happened, set by whoever
posts it: the state machine never reads a clock, so a recorded sequence of
events replays to the same states.

Three kinds, as docs/design.md draws them:

- requests from users (the API, the CLI, the service, workflows):
  ``AddRequested``, ``SubmitRequested``, ``KillRequested``,
  ``ResubmitRequested``, ``ReleaseRequested``, ``ForceStatusRequested``,
  ``RemoveRequested``;
- reports from the runtime on the instructions it carried out and from
  drivers on their runs: ``Prepared``, ``PrepareFailed``, ``SubmitOutcomes``,
  ``KillOutcomes``, ``LookupOutcomes``, ``StatusReport``, ``RunsSilent``, ``RunLost``,
  ``LinkedAdded``, ``PostprocessDone``;
- internal: ``Started`` (a home was opened and its jobs loaded),
  ``RetryDue``.

``StatusChanged`` is not an input: it is what observers receive for each
change a step made (see :mod:`.step`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .actions import Rule
from .analyser import Limits
from .ids import FQID, Runs
from .runlog import RunLog
from .statuses import JobStatus

if TYPE_CHECKING:
    from .errors import JobError


@dataclass(frozen=True, slots=True)
class Profile:
    """What the state machine must know of a top-level job's definition to decide for it.

    Built by the runtime from the job's definition and its driver's declared
    capabilities; the definition itself (application, files, settings) never
    enters the core.
    """

    backend: str
    #: The driver submits / kills many runs in one call; else the runtime emulates it run by run.
    native_submit: bool = True
    native_kill: bool = True
    #: Runs go through the job wrapper: a run's end is judged from its log.
    wrapper: bool = False
    #: The driver can tell, by a run's key, whether it got it (reconciliation after a crash).
    lookup: bool = False
    limits: Limits = Limits(0, 0, 0, 60.0)
    #: The job has steps (DataGrid): failed runs resume from their newest saved state.
    checkpointable: bool = False
    max_restarts: int = 3
    #: ``submit()`` splits the job into subjobs.
    splits: bool = False
    #: Postprocessors (mergers, checkers, notifiers) run once every subjob ended.
    postprocess: bool = False
    #: A notification asks to be told when the master becomes held (the others wait for its end).
    notify_held: bool = False
    #: A pre-job runs before the subjobs; an aggregator after them (DataGrid's partitioned job).
    prejob: bool = False
    aggregator: bool = False
    min_success: float = 1.0
    #: The action table's rules that may apply to this job's backend, in order (see :mod:`.actions`).
    actions: tuple[Rule, ...] = ()
    #: A run that would succeed but left a declared ``outputfiles`` pattern unmatched fails instead.
    fail_on_missing_output: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every event: a stimulus id, and the time it happened."""

    stimulus_id: str
    time: float

    @property
    def ids(self) -> tuple[FQID, ...]:
        """The job ids this event is about."""
        return ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Request(Event):
    """A user's request on a batch of jobs, in the order given."""

    targets: tuple[FQID, ...]
    keep_going: bool = False

    @property
    def ids(self) -> tuple[FQID, ...]:
        return self.targets


# ----------------------------------------------------------------- requests
@dataclass(frozen=True, slots=True, kw_only=True)
class AddRequested(Request):
    """A new top-level job, already stored by the runtime under ``targets[0]``, is to be known."""

    profile: Profile
    #: Set for a pre-job or aggregator: ``(master, role)``.
    link: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitRequested(Request):
    """Split and submit new top-level jobs; ``profiles``: those whose definition changed since they were added."""

    profiles: Mapping[int, Profile] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class KillRequested(Request):
    """Kill jobs: a master's every active subjob; a final job is left as it is."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ResubmitRequested(Request):
    """Run jobs again: a master's failed subjobs (and killed ones unless ``only_failed``).

    ``profile`` is set when ``resubmit(backend=...)`` changed the backend's
    settings (the runtime checked them and rebuilt the profile); ``start`` is
    what each run starts from: ``initial`` (the job's first state) or
    ``given`` (a state the user handed in, held by the runtime).
    """

    only_failed: bool = True
    profile: Profile | None = None
    backend: Any = None
    start: str = "initial"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseRequested(Request):
    """Resume held jobs; ``retry_args`` replace the arguments the hold left (``None``: keep them)."""

    retry_args: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ForceStatusRequested(Request):
    """Mark stuck jobs ``failed`` or ``completed``; active ones are killed first unless ``force``."""

    status: JobStatus = JobStatus.FAILED
    force: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoveRequested(Request):
    """Forget final or new top-level jobs, their subjobs and workspaces."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MergeRequested(Request):
    """Run ended masters' postprocessors again over every subjob (``orchestrator merge``), replacing the
    output they made before."""


# ------------------------------------------------------ reports on instructions
@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared(Event):
    """A job was made ready to run: split into ``n_subjobs`` stored subjobs (0: it runs itself)."""

    job: int
    n_subjobs: int = 0

    @property
    def ids(self) -> tuple[FQID, ...]:
        return ((self.job,),)


@dataclass(frozen=True, slots=True, kw_only=True)
class PrepareFailed(Event):
    """Splitting or configuring failed; the runtime removed what it had made."""

    job: int
    error: JobError

    @property
    def ids(self) -> tuple[FQID, ...]:
        return ((self.job,),)


@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitOutcomes(Event):
    """What a backend did with a ``SendSubmit``: accepted, rejected (with reasons), not attempted.

    ``native``: the submission went out as one bulk call (rejections are
    failures), not emulated run by run (rejections are left unsubmitted).
    The backend ids of accepted runs went to the runtime's store directly.
    A large submission is answered in parts, one per chunk the driver was
    sent: ``runs`` is then the chunk's runs, and ``more`` says that other
    parts follow (the request is answered with the last).
    """

    runs: Runs
    accepted: Sequence[int] = ()
    rejected: Sequence[tuple[int, str]] = ()
    not_attempted: Sequence[int] = ()
    native: bool = True
    #: The checkpoint state each accepted run (by position) starts from, when it has one that is new
    #: (``seq``, ``label``, ``final``, ``time``): the run's newest state from now on.
    states: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    more: bool = False
    #: Of a part: the first run of the instruction it answers (with the stimulus id, that instruction's key:
    #: two instructions of one step for one job differ by it); ``None``: the first of ``runs``.
    first: int | None = None

    @property
    def ids(self) -> tuple[FQID, ...]:
        return self.runs.fqids()


@dataclass(frozen=True, slots=True, kw_only=True)
class KillOutcomes(Event):
    """What a backend did with a ``SendKill``: positions in ``runs`` killed, failed, not attempted."""

    runs: Runs
    killed: Sequence[int] = ()
    failed: Sequence[tuple[int, str]] = ()
    not_attempted: Sequence[int] = ()

    @property
    def ids(self) -> tuple[FQID, ...]:
        return self.runs.fqids()


@dataclass(frozen=True, slots=True, kw_only=True)
class LookupOutcomes(Event):
    """Runs left ``submitting`` by a crash, looked up by key: those the backend has, and those it never got."""

    runs: Runs
    found: Sequence[int] = ()
    absent: Sequence[int] = ()

    @property
    def ids(self) -> tuple[FQID, ...]:
        return self.runs.fqids()


@dataclass(frozen=True, slots=True)
class RunReport:
    """A backend's word on a batch of runs of one job, all in the same new ``status``.

    ``log`` (read by the runtime from the run's attempt-scoped log, for
    drivers that run the wrapper), ``stderr_tail`` and ``state`` (the newest
    checkpoint the run saved: ``seq``, ``label``, ``final``, ``time``) come
    with a run's end, so the analyser judges without I/O.
    """

    runs: Runs
    status: JobStatus
    exit_code: int | None = None
    reason: str | None = None
    #: ``aborted``, ``cancelled`` (held by the system), ``lost``, or ``None``.
    verdict: str | None = None
    log: RunLog | None = None
    stderr_tail: str | None = None
    state: dict[str, Any] | None = None
    #: CPU and wall seconds the attempt used, when the wrapper recorded them.
    usage: dict[str, float] | None = None
    #: When the run started and ended by its own log (the wrapper's start and end lines) or the backend's
    #: record, epoch seconds; ``None``: unknown (the time the report was made stands in).
    started: float | None = None
    ended: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusReport(Event):
    """News from monitoring one backend (or, with a request's stimulus id, on its instruction)."""

    backend: str
    reports: tuple[RunReport, ...] = ()

    @property
    def ids(self) -> tuple[FQID, ...]:
        return tuple(fq for r in self.reports for fq in r.runs)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunsSilent(Event):
    """Monitoring has had no intelligible word on these runs of one job since ``since`` (each at its attempt in
    ``attempts``, in the order of ``runs``): the core decides whether that makes them lost
    (``lost_after_seconds``). Reported on every tick that heard nothing of them."""

    backend: str
    runs: Runs
    attempts: tuple[int, ...]
    since: float
    reason: str

    @property
    def ids(self) -> tuple[FQID, ...]:
        return self.runs.fqids()


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLost(Event):
    """No intelligible word on these runs for ``lost_after_seconds``: counted lost (orchestrator level)."""

    runs: Runs
    reason: str

    @property
    def ids(self) -> tuple[FQID, ...]:
        return self.runs.fqids()


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkedAdded(Event):
    """The runtime added the pre-job or aggregator a ``CreateLinked`` asked for, as top-level job ``job``."""

    job: int
    master: int
    role: str
    profile: Profile

    @property
    def ids(self) -> tuple[FQID, ...]:
        return ((self.job,), (self.master,))


@dataclass(frozen=True, slots=True, kw_only=True)
class PostprocessDone(Event):
    """A master's postprocessors ran; ``error`` says why they failed it (``None``: they passed).

    ``failed_subjobs`` are subjobs a checker failed, with the reason each.
    """

    job: int
    error: str | None = None
    failed_subjobs: Sequence[tuple[int, str]] = ()

    @property
    def ids(self) -> tuple[FQID, ...]:
        return ((self.job,),)


# ------------------------------------------------------------------ internal
@dataclass(frozen=True, slots=True, kw_only=True)
class Started(Event):
    """A home was opened and every job loaded: settle what a crash interrupted, run what fell due."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryDue(Event):
    """A retry scheduled by ``ScheduleRetry`` is due."""

    runs: Runs

    @property
    def ids(self) -> tuple[FQID, ...]:
        return self.runs.fqids()


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusChanged(Event):
    """Observers' view of one change: ``ids`` moved from ``old`` to ``new`` (``forced`` by a user)."""

    changed: tuple[FQID, ...] | Runs
    old: JobStatus
    new: JobStatus
    forced: bool = False

    @property
    def ids(self) -> tuple[FQID, ...]:
        return self.changed.fqids() if isinstance(self.changed, Runs) else self.changed


__all__ = [
    "AddRequested", "Event", "ForceStatusRequested", "KillOutcomes", "KillRequested", "LinkedAdded",
    "LookupOutcomes", "PostprocessDone", "PrepareFailed", "Prepared", "Profile", "ReleaseRequested",
    "MergeRequested", "RemoveRequested", "Request", "ResubmitRequested", "RetryDue", "RunLost", "RunReport",
    "RunsSilent", "Started", "StatusChanged", "StatusReport", "SubmitOutcomes", "SubmitRequested",
]
