"""The backend-driver contract: what a plugin implements, and what it is handed.

A driver is thin: it submits, kills and reports on runs. The core owns
every meaning (statuses, retries, keep_going, bulk, what a failure is). A
driver declares what it does natively in :class:`Capabilities`; what it
lacks, the runtime emulates (bulk submission run by run, with bounded
concurrency; status polling). Capabilities are declared, never detected.

Each method comes in a single-run and a bulk form; implement whichever
suits the backend: the base class makes each form from the other, so a
backend with only a bulk API writes only the bulk forms. The runtime calls
the bulk form when the capability is declared, and the single-run form,
run by run, when it is not (keep_going=False then stops at the first
failure, as docs/design.md's emulated bulk does).

Two ways to monitor, by ``Capabilities.reports``:

- polled (the default): the runtime calls ``status_bulk`` (or ``status``)
  every ``poll_interval`` with the runs the driver holds, and the driver
  answers what changed;
- reported: the driver learns of changes itself (a process ended, a queue
  answered) and calls ``await self.context.report(updates)``; the runtime
  never polls it, so an idle backend costs nothing. After a restart the
  runtime hands it the runs it still holds with ``track``.

Plugins register under the entry-point group ``orchestrator.backends``::

    [project.entry-points."orchestrator.backends"]
    mybackend = "mypkg:MyDriver"
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import structlog

from ..core.statuses import JobStatus
from .settings import NoSettings, Settings, SettingsError


class SubmitError(RuntimeError):
    """This run could not be submitted; the core decides what that means."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a driver does natively. ``False``: the runtime emulates it."""

    bulk_submit: bool = False
    bulk_kill: bool = False
    bulk_status: bool = False
    #: Runs go through the job wrapper, so the runtime reads the run's log to judge how it ended;
    #: else the driver's word is final.
    runs_wrapper: bool = False
    #: Runs save checkpoint states on another machine: ``fetch_states`` copies them back each tick.
    remote_states: bool = False
    #: The backend can be asked, by ``RunSpec.key``, whether it got a run (``lookup``). After a crash
    #: the core adopts or sends again each run caught mid-submission; without it such runs go back
    #: to ``new`` for the user to decide, never submitted twice behind their back.
    lookup: bool = False
    #: The driver reports changes itself (``context.report``): it is never polled.
    reports: bool = False


@dataclass(frozen=True, slots=True)
class RunSpec:
    """Everything a driver needs to start one run (one attempt) of one job or subjob."""

    fqid: str
    index: int
    #: The attempt: 1 on the first submission, +1 on each resubmission or retry.
    attempt: int
    #: Unique per run and attempt, stable across restarts of the orchestrator: pass it to the
    #: backend (job name, comment, tag) so that ``lookup`` can find the run again. A retry has a new key.
    key: str
    executable: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    settings: Mapping[str, Any]
    #: Input files (absolute paths) to place in the working directory.
    inputs: tuple[Path, ...]
    outputfiles: tuple[str, ...]
    #: The job's directory under the home; ``inputdir``, ``outputdir`` and ``workdir`` are in it.
    jobdir: Path
    inputdir: Path
    outputdir: Path
    workdir: Path
    mode: str = "production"
    retry_count: int = 0
    retry_args: tuple[str, ...] = ()
    #: The OS user the run belongs to (its job's owner); ``None``: the orchestrator's own user. A driver
    #: runs everything it does for the run (the process, staging, backend commands) as this user.
    owner: str | None = None


#: ``parent / name`` for a name without separators, as a :class:`RunSpec`'s directories are made. Python 3.11's ``/``
#: parses the name every time: four paths a run, a microsecond each, were a tenth of a million-run submission.
#: pathlib's own method for the children it lists skips that; where a Python lacks it (its ``/`` no longer parses
#: eagerly), ``/`` it is.
child_path: Callable[[Path, str], Path] = getattr(Path, "_make_child_relpath", Path.__truediv__)


@dataclass(frozen=True, slots=True)
class RunHandle:
    """A submitted run, as the driver answered for it."""

    fqid: str
    index: int
    backend_id: str
    settings: Mapping[str, Any]
    outputdir: Path
    #: The status the core last recorded; a polled driver answers only what differs from it.
    status: JobStatus = JobStatus.SUBMITTED
    key: str = ""
    attempt: int = 0
    #: The job's directory under the home (a place for the driver's own per-run files, if it needs any).
    jobdir: Path = Path()
    #: The OS user the run belongs to (``RunSpec.owner``): its kill and status commands act as this user.
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class StatusUpdate:
    """A run's status as the backend sees it.

    ``status`` is a :class:`JobStatus`: ``submitted``, ``running``,
    ``completing``, or an ending: ``completed``, ``failed``, ``killed``,
    ``held``. ``exit_code`` and ``reason`` are kept for the record.
    ``backend_verdict`` says why a run ended other than by itself:
    ``"aborted"`` (the backend gave up on it: late, unhandled),
    ``"cancelled"`` (the system cancelled it: the job is held), ``"lost"``
    (nobody can say what became of it). See ``docs/plugins.md`` for the
    verdict each pair leads to. ``started`` and ``ended`` (epoch seconds,
    optional) are when the run started and ended by its own record (the
    wrapper's start and end lines, the batch system's accounting): they
    become the run's ``running`` and final times, instead of the time the
    report arrived (:func:`~orchestrator.plugin.wrapper.status_from_log`
    fills them from the wrapper's log).
    """

    fqid: str
    status: JobStatus
    exit_code: int | None = None
    reason: str | None = None
    backend_verdict: str | None = None
    started: float | None = None
    ended: float | None = None


@dataclass(frozen=True, slots=True)
class SubmitOutcome:
    """One run's result within a bulk submission."""

    fqid: str
    backend_id: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.backend_id is not None and self.error is None


async def _nowhere(updates: Sequence[StatusUpdate]) -> None:
    raise RuntimeError("this driver's context has no runtime to report to")


@dataclass
class DriverContext:
    """What the runtime hands a driver: where it may keep files, its settings, where to report."""

    #: The home (on a shared repository, its shared directory: the job workspaces' root).
    home: Path
    #: ``[backends.<name>]`` of the configuration file.
    config: Mapping[str, Any] = field(default_factory=dict)
    #: A directory private to this driver inside ``home`` (created for it; on a shared repository every home
    #: on it sees the same one, so a standby's driver finds what the active one's wrote).
    statedir: Path = Path()
    log: Any = field(default_factory=structlog.get_logger)
    #: For drivers that declare ``Capabilities(reports=True)``: hand the runtime what changed.
    report: Callable[[Sequence[StatusUpdate]], Awaitable[None]] = _nowhere


def _missing(cls: type[Driver], one: str, many: str) -> str | None:
    if getattr(cls, one) is getattr(Driver, one) and getattr(cls, many) is getattr(Driver, many):
        return f"driver {cls.__name__} must implement {one}() or {many}()"
    return None


def _one_of(driver: Driver, one: str, many: str) -> None:
    """Each default form calls the other: with neither implemented, say so instead of recursing."""
    missing = _missing(type(driver), one, many)
    if missing is not None:
        raise NotImplementedError(missing)


class Driver:
    """Base of backend drivers; see the module docstring."""

    #: The name the backend is registered under (``Backend("name")``).
    name: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities()
    #: The backend's settings, a dataclass: ``Backend("name", **settings)`` is checked against it.
    settings: ClassVar[type[Settings]] = NoSettings

    def __init__(self, context: DriverContext) -> None:
        self.context = context

    @classmethod
    def check_implemented(cls) -> None:
        """A registered driver implements one form of submit and of kill (the runtime checks at load)."""
        for one, many in (("submit", "submit_bulk"), ("kill", "kill_bulk")):
            missing = _missing(cls, one, many)
            if missing is not None:
                raise TypeError(missing)

    @classmethod
    def validate_settings(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        """A job's settings checked (unknown keys, types, values), normalised; :class:`SettingsError` names the
        setting at fault. The default checks them against :attr:`settings`."""
        return cls.settings.validate(settings, backend=cls.name)

    @classmethod
    def check_executable(cls, executable: str, settings: Mapping[str, Any]) -> str | None:
        """What is known wrong with a run's executable before anything is stored, or ``None``.

        Called at ``add()`` and for each subjob whose executable the split changes, so that a job that
        cannot start is refused then, not failed later. A driver whose runs start on this machine checks
        that an absolute path exists and is executable; the default knows nothing of where runs start.
        """
        return None

    def capabilities_for(self, settings: Mapping[str, Any]) -> Capabilities:
        """Capabilities for runs with these settings (a backend may offer two modes)."""
        return self.capabilities

    # ------------------------------------------------------------ submission
    async def submit(self, run: RunSpec) -> str:
        """Start ``run``; return its backend id, or raise :class:`SubmitError`."""
        _one_of(self, "submit", "submit_bulk")
        outcome = (await self.submit_bulk([run]))[0]
        if not outcome.ok:
            raise SubmitError(outcome.error or "submission refused")
        assert outcome.backend_id is not None
        return outcome.backend_id

    async def submit_bulk(self, runs: Sequence[RunSpec]) -> list[SubmitOutcome]:
        """Start many runs (all with the same settings) in one go; one outcome per run, in order."""
        _one_of(self, "submit", "submit_bulk")
        out = []
        for run in runs:
            try:
                out.append(SubmitOutcome(run.fqid, await self.submit(run)))
            except SubmitError as exc:
                out.append(SubmitOutcome(run.fqid, None, str(exc) or "submission refused"))
        return out

    # ------------------------------------------------------------ kill
    async def kill(self, handle: RunHandle) -> None:
        """Stop the run (all its processes); raise if it could not be."""
        _one_of(self, "kill", "kill_bulk")
        error = (await self.kill_bulk([handle]))[0]
        if error is not None:
            raise RuntimeError(error)

    async def kill_bulk(self, handles: Sequence[RunHandle]) -> list[str | None]:
        """Kill many runs; one error message (or ``None``) per handle, in order."""
        _one_of(self, "kill", "kill_bulk")
        out: list[str | None] = []
        for handle in handles:
            try:
                await self.kill(handle)
                out.append(None)
            except Exception as exc:  # reported per run: the core decides by keep_going
                out.append(str(exc) or type(exc).__name__)
        return out

    # ------------------------------------------------------------ monitoring
    async def status(self, handle: RunHandle) -> StatusUpdate | None:
        """The run's status, or ``None`` when it is unchanged (polled drivers)."""
        updates = await self.status_bulk([handle])
        return updates[0] if updates else None

    async def status_bulk(self, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        """What changed among many runs (polled drivers); runs left out are unchanged."""
        if type(self).status is Driver.status:
            raise NotImplementedError(f"{type(self).__name__} is polled but implements neither status() "
                                      "nor status_bulk() (or declare Capabilities(reports=True))")
        out = []
        for handle in handles:
            update = await self.status(handle)
            if update is not None:
                out.append(update)
        return out

    async def track(self, handles: Sequence[RunHandle]) -> None:
        """Reported drivers: watch these runs, submitted before a restart, and report on them."""

    async def forget(self, handles: Sequence[RunHandle]) -> None:
        """These runs are of no more interest (forced to an end, removed): stop watching them."""

    # ------------------------------------------------------------ optional abilities
    async def fetch_states(self, handles: Sequence[RunHandle], targets: Sequence[Path]) -> None:
        """Copy each running run's ``.orch-state`` dir into ``targets[i]`` (``remote_states`` drivers)."""
        raise NotImplementedError(f"{type(self).__name__} declares remote_states but has no fetch_states()")

    async def lookup(self, runs: Sequence[RunSpec]) -> list[str | None]:
        """Runs the core asked for just before it stopped: for each, the backend id of the run the
        backend got under ``run.key``, or ``None`` when it never got one (so sending it is no
        duplicate). Raise when the backend cannot be asked now: the runtime asks again later."""
        raise NotImplementedError(f"{type(self).__name__} declares lookup but has no lookup()")

    def metrics(self) -> dict[str, Any]:
        """The driver's own counters (calls made, queue lengths...), for ``orch.metrics()`` and monitoring."""
        return {}

    # ------------------------------------------------------------ life
    async def serve(self) -> None:
        """A background loop, run in the runtime's task group until close."""

    async def aclose(self) -> None:
        """Release connections and files."""


__all__ = ["Capabilities", "Driver", "DriverContext", "RunHandle", "RunSpec", "SettingsError", "StatusUpdate",
           "SubmitError", "SubmitOutcome"]
