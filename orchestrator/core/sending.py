"""Instructions to drivers, with the bookkeeping their outcomes are read against.

Every ``SendSubmit`` and ``SendKill`` is remembered under (stimulus id, job,
first run of the batch): the outcome event comes back with the same stimulus
id and names the same runs, and the record says what a rejected run becomes
and which request waits. One event may send several batches of one job (two
of its runs retried from one status report): each has its own record.
A submission is always preceded by ``Persist``: the runs are on disk as
``submitting``, with the attempt that makes their key, before any backend
hears of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Core, Killing, Sending, send_key
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
    runs = core.runs_of(js, indexes)
    core.emit(SendSubmit(stimulus_id=sid, backend=js.profile.backend, runs=runs,
                         native=js.profile.native_submit, stop_on_failure=stop_on_failure, start=start))
    core.sending[send_key(sid, runs)] = Sending(kind, request, was_new)


def send_kill(core: Core, js: JobState, indexes: Sequence[int], sid: str, *, request: str | None = None,
              to: JobStatus | None = JobStatus.KILLED, forced: bool = False, stop_on_failure: bool = False) -> None:
    """Kill runs at their backend; killed, they become ``to`` (``None``: they stay as they are)."""
    if not indexes:
        return
    runs = core.runs_of(js, indexes)
    core.emit(SendKill(stimulus_id=sid, backend=js.profile.backend, runs=runs,
                       native=js.profile.native_kill, stop_on_failure=stop_on_failure))
    core.killing[send_key(sid, runs)] = Killing(request, to, forced)
