"""The public backend-driver contract: what a plugin implements.

A driver is thin: it submits, kills and reports the status of runs. The
core owns every semantic (statuses, retries, keep_going, bulk). A driver
declares its native abilities in :class:`Capabilities`; for each ability it
lacks, the core emulates it with a bounded-concurrency loop over the
single-run method. Capabilities are declared, never detected.

Plugins register under the entry-point group ``orchestrator.backends``::

    [project.entry-points."orchestrator.backends"]
    mybackend = "mypkg:MyDriver"
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import structlog

from .status import JobStatus


class SettingsError(ValueError):
    """A backend setting is invalid; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class SubmitError(RuntimeError):
    """This run could not be submitted; the core decides what that means."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a driver does natively. ``False``: the core emulates it."""

    bulk_submit: bool = False
    bulk_kill: bool = False
    bulk_status: bool = False
    #: The backend can resubmit a run by its old id; else resubmission is a new submit.
    resubmit: bool = False
    #: Runs go through the job wrapper, so the core reads ``orch.log`` in the output
    #: dir to classify how each run ended; else the driver's word is final.
    runs_wrapper: bool = False
    #: Runs save checkpoint states on another machine: ``fetch_states`` copies them back each tick.
    remote_states: bool = False
    #: The backend can be asked, by ``RunSpec.key``, whether it got a run (``lookup``). After a crash
    #: the core uses it to adopt or send again each run caught mid-submission; without it such runs
    #: go back to ``new`` for the user to decide, never submitted twice behind their back.
    lookup: bool = False


@dataclass(frozen=True, slots=True)
class RunSpec:
    """Everything a driver needs to start one run of one (sub)job."""

    fqid: str
    index: int
    attempt: int
    #: Unique per run and stable across restarts: pass it to the backend
    #: (job name, comment, tag) so a run can be found again.
    key: str
    executable: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    settings: Mapping[str, Any]
    #: Input files (absolute paths) to place in the working directory.
    inputs: tuple[Path, ...]
    outputfiles: tuple[str, ...]
    jobdir: Path
    inputdir: Path
    outputdir: Path
    workdir: Path
    mode: str = "production"
    retry_count: int = 0
    retry_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RunHandle:
    """A submitted run, as the core remembers it between ticks."""

    fqid: str
    index: int
    backend_id: str
    settings: Mapping[str, Any]
    outputdir: Path
    #: The status the core last recorded; drivers may report only changes.
    status: JobStatus = JobStatus.SUBMITTED


@dataclass(frozen=True, slots=True)
class StatusUpdate:
    """A run's status as the backend sees it.

    ``status`` is one of submitted, running, completed, failed, killed,
    held. ``exit_code`` and ``reason`` are kept for the record.
    """

    fqid: str
    status: JobStatus
    exit_code: int | None = None
    reason: str | None = None
    #: ``"aborted"`` (the backend gave up on the run), ``"cancelled"`` (the system
    #: cancelled it: the job is held), ``"lost"``; ``None`` for an ordinary ending.
    backend_verdict: str | None = None


@dataclass(frozen=True, slots=True)
class SubmitOutcome:
    """One run's result within a bulk submission."""

    fqid: str
    backend_id: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.backend_id is not None and self.error is None


@dataclass
class DriverContext:
    """What the core hands a driver: where it may keep files, its config."""

    home: Path
    #: ``[backends.<name>]`` of the configuration file.
    config: Mapping[str, Any] = field(default_factory=dict)
    #: A directory private to this driver inside the home (created for it).
    statedir: Path = Path()
    log: Any = field(default_factory=structlog.get_logger)


class Driver(ABC):
    """Base class of backend drivers."""

    #: The name the backend is registered under (``Backend("name")``).
    name: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities] = Capabilities()

    def __init__(self, context: DriverContext) -> None:
        self.context = context

    @classmethod
    def validate_settings(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Check a job's settings; return them normalised or raise :class:`SettingsError`."""
        if settings:
            key = next(iter(settings))
            raise SettingsError(key, f"backend {cls.name!r} takes no setting {key!r}")
        return {}

    def capabilities_for(self, settings: Mapping[str, Any]) -> Capabilities:
        """Capabilities for runs with these settings (a backend may offer both modes)."""
        return self.capabilities

    # Single-run forms: every driver has these.
    @abstractmethod
    async def submit(self, run: RunSpec) -> str:
        """Start ``run``; return its backend id or raise :class:`SubmitError`."""

    @abstractmethod
    async def kill(self, handle: RunHandle) -> None:
        """Stop the run (all its processes)."""

    async def status(self, handle: RunHandle) -> StatusUpdate | None:
        """The run's status, or ``None`` when it is unchanged."""
        raise NotImplementedError(f"{type(self).__name__} must implement status() or status_bulk()")

    # Native bulk forms, used when the capability is declared.
    async def submit_bulk(self, runs: Sequence[RunSpec]) -> list[SubmitOutcome]:
        raise NotImplementedError

    async def kill_bulk(self, handles: Sequence[RunHandle]) -> list[str | None]:
        """Kill many runs; one error message (or ``None``) per handle."""
        raise NotImplementedError

    async def status_bulk(self, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        """Status of many runs in one go; runs left out are unchanged."""
        raise NotImplementedError

    async def resubmit(self, run: RunSpec, previous: RunHandle) -> str:
        raise NotImplementedError

    async def fetch_states(self, handles: Sequence[RunHandle], targets: Sequence[Path]) -> None:
        """Copy each running run's ``.orch-state`` dir into ``targets[i]`` (``remote_states`` drivers)."""
        raise NotImplementedError(f"{type(self).__name__} declares remote_states but has no fetch_states()")

    async def lookup(self, runs: Sequence[RunSpec]) -> list[str | None]:
        """Runs the core asked for just before it stopped: for each, the backend id of the run the
        backend got under ``run.key``, or ``None`` when it never got one (so sending it is no
        duplicate). Raise when the backend cannot be asked now: the core asks again later."""
        raise NotImplementedError(f"{type(self).__name__} declares lookup but has no lookup()")

    # Lifecycle.
    async def serve(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """A background loop, run in the orchestrator's task group until close."""

    async def aclose(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Release connections and files."""
