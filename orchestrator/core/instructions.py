"""Instructions: what the state machine asks the runtime to do, in order.

The runtime carries out a step's instructions in the order given and turns
each asynchronous result into the next event; it decides nothing. Each
instruction carries the stimulus id of what caused it, and the report on it
carries that id back.

- ``Persist``: a barrier. Everything changed so far reaches the repository
  before the next instruction is carried out (write-ahead: a run is on disk
  as ``submitting``, with the attempt that makes its key, before any backend
  hears of it). Changes are otherwise written behind, in batches per tick.
- ``Prepare``: split a job into subjobs and store them, configure its shared
  inputs. Answered by ``Prepared`` or ``PrepareFailed``.
- ``SendSubmit`` / ``SendKill`` / ``Lookup``: to the job's driver actor, in
  bulk (``native``) or emulated run by run; ``stop_on_failure`` stops an
  emulated series at the first failure (keep_going=False). Answered by
  ``SubmitOutcomes`` / ``KillOutcomes`` / ``LookupOutcomes``.
- ``Unwatch``: these runs left the backend's hands; stop monitoring them.
- ``RunPostprocess``: run a master's postprocessors; answered by ``PostprocessDone``.
- ``CreateLinked``: add a pre-job or aggregator for a master; answered by ``LinkedAdded``.
- ``ScheduleRetry``: post ``RetryDue`` at ``at``.
- ``AdjustRun``: change runs' backend settings before their retry, as an action-table rule asks.
- ``SetBackend``: store new backend settings for a job (``resubmit(backend=...)``).
- ``Unprepare`` / ``Forget``: undo a ``Prepare`` (a rolled-back submission: the subjobs and the
  workspace it made go) / remove a whole job.
- ``Reply``: answer a request: its error, if any, and what it acted on.
- ``Notify``: tell people (the Notifier) that something happened to a master.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import JobError
from .ids import Runs


@dataclass(frozen=True, slots=True, kw_only=True)
class Instruction:
    stimulus_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Persist(Instruction):
    """Write every change so far before going on."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepare(Instruction):
    """Make ``job`` ready to run; its subjobs are stored ``submitting`` (the write-ahead record of the
    submission that follows) unless ``submitting`` is false (they wait, ``new``, for a pre-job)."""

    job: int
    submitting: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class SendSubmit(Instruction):
    """Submit ``runs`` (already ``submitting``, attempts counted) to ``backend``.

    ``start``: which checkpoint state each run starts from: ``initial``,
    ``resume`` (the newest saved), or ``given`` (a state the user handed in).
    ``attempts``: each run's attempt (in the order of ``runs``), the one its
    key and directory are made for; ``retry_args``: the arguments a retry
    adds, by run index (a job that runs itself is index 0), for the runs
    that have any. The runtime needs nothing else from the core to send it.
    """

    backend: str
    runs: Runs
    native: bool
    stop_on_failure: bool = False
    start: str = "resume"
    attempts: Sequence[int] = ()
    retry_args: Mapping[int, Sequence[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class SendKill(Instruction):
    """Kill ``runs`` at ``backend``; ``attempts``: each run's attempt as it was when the kill was decided, so a
    retry submitted by the same step is never the one killed."""

    backend: str
    runs: Runs
    native: bool
    stop_on_failure: bool = False
    attempts: Sequence[int] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Lookup(Instruction):
    """Ask ``backend`` what became of ``runs`` (interrupted by a restart), at their ``attempts``."""

    backend: str
    runs: Runs
    attempts: Sequence[int] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Unwatch(Instruction):
    backend: str
    runs: Runs


@dataclass(frozen=True, slots=True, kw_only=True)
class RunPostprocess(Instruction):
    job: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CreateLinked(Instruction):
    """Add the pre-job or aggregator of ``master`` (an aggregator gets ``steps``: its subjobs' final states)."""

    master: int
    role: str
    steps: tuple[str, ...] | None = None
    #: An aggregator of an earlier round exists: run it again with the new steps instead of adding one.
    reuse: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AdjustRun(Instruction):
    """Before a retry: change the backend settings of ``runs`` as the action-table rule ``rule`` asks.

    ``setting`` times ``factor`` (at most ``cap``) for ``more_memory`` / ``more_time``; the ``values`` for
    ``elsewhere``. The runtime holds the settings, so it computes and records the new values.
    """

    runs: Runs
    rule: str
    setting: str | None = None
    factor: float = 1.0
    cap: str | None = None
    values: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleRetry(Instruction):
    runs: Runs
    at: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SetBackend(Instruction):
    """``resubmit(backend=...)``: new backend settings for ``job`` and its ``subjobs`` (how many it has)."""

    job: int
    backend: Any
    subjobs: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Unprepare(Instruction):
    job: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Forget(Instruction):
    job: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply(Instruction):
    """The answer to the request ``stimulus_id``: ``error`` (``None``: done), how many runs it acted on."""

    error: JobError | None = None
    acted: int = 0
    value: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Notify(Instruction):
    """A master ended ``status``: tell whoever its Notifier names."""

    job: int
    status: str


__all__ = [
    "AdjustRun", "CreateLinked", "Forget", "Instruction", "Lookup", "Notify", "Persist", "Prepare", "Reply",
    "RunPostprocess", "ScheduleRetry", "SendKill", "SendSubmit", "SetBackend", "Unprepare", "Unwatch",
]
