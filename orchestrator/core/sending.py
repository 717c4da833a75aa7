"""Instructions to drivers, with the bookkeeping their outcomes are read against.

Every ``SendSubmit`` and ``SendKill`` is remembered under (stimulus id, job):
the outcome event comes back with the same stimulus id and names the job,
and the record says what a rejected run becomes and which request waits.
A submission is always preceded by ``Persist``: the runs are on disk as
``submitting``, with the attempt that makes their key, before any backend
hears of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Core, Killing, Sending
from .instructions import Persist, SendKill, SendSubmit
from .jobs import JobState
from .statuses import JobStatus


def send_submit(core: Core, js: JobState, indexes: Sequence[int], sid: str, *, kind: str,
                request: str | None = None, stop_on_failure: bool = False, start: str = "resume",
                was_new: frozenset[int] = frozenset(), persist: bool = True) -> None:
    """Submit runs already moved to ``submitting``."""
    if not indexes:
        return
    if persist:
        core.emit(Persist(stimulus_id=sid))
    core.emit(SendSubmit(stimulus_id=sid, backend=js.profile.backend, runs=core.runs_of(js, indexes),
                         native=js.profile.native_submit, stop_on_failure=stop_on_failure, start=start))
    core.sending[(sid, js.id)] = Sending(kind, request, was_new)


def send_kill(core: Core, js: JobState, indexes: Sequence[int], sid: str, *, request: str | None = None,
              to: JobStatus | None = JobStatus.KILLED, forced: bool = False, stop_on_failure: bool = False) -> None:
    """Kill runs at their backend; killed, they become ``to`` (``None``: they stay as they are)."""
    if not indexes:
        return
    core.emit(SendKill(stimulus_id=sid, backend=js.profile.backend, runs=core.runs_of(js, indexes),
                       native=js.profile.native_kill, stop_on_failure=stop_on_failure))
    core.killing[(sid, js.id)] = Killing(request, to, forced)
