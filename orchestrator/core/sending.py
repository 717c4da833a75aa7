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

from array import array
from collections.abc import Mapping, Sequence

from .base import Core, Killing, Sending, send_key
from .ids import Runs
from .instructions import Persist, SendKill, SendSubmit
from .jobs import JobState
from .statuses import JobStatus


def attempts_of(js: JobState, runs: Runs) -> Sequence[int]:
    """Each run's attempt now, in the order of ``runs``, as an ``array("q")``: a slice of the job's array for a
    range (a million, in C)."""
    table = js.runs.attempt
    idx = runs.indexes
    if idx is None:
        return array("q", [js.attempt if js.is_master else table[0]])
    if isinstance(idx, range) and idx.step == 1:
        return table[idx.start:idx.stop]
    return array("q", [table[i] for i in idx])


def retry_args_of(js: JobState, runs: Runs) -> Mapping[int, Sequence[str]]:
    """The retry arguments of the runs that have any, by index: looked up from the smaller side (few runs have
    extras)."""
    extras = js.runs.extras
    if not extras:
        return {}
    idx = runs.indexes
    if idx is None:
        wanted: Sequence[int] = [0]
    elif len(extras) < len(idx):
        members = idx if isinstance(idx, range) else set(idx)
        wanted = sorted(i for i in extras if i in members)
    else:
        wanted = [i for i in idx if i in extras]
    found = {i: extras[i].retry_args for i in wanted if i in extras}
    return {i: list(args) for i, args in found.items() if args}


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
                         native=js.profile.native_submit, stop_on_failure=stop_on_failure, start=start,
                         attempts=attempts_of(js, runs), retry_args=retry_args_of(js, runs)))
    core.sending[send_key(sid, runs)] = Sending(kind, request, was_new)


def send_kill(core: Core, js: JobState, indexes: Sequence[int], sid: str, *, request: str | None = None,
              to: JobStatus | None = JobStatus.KILLED, forced: bool = False, stop_on_failure: bool = False) -> None:
    """Kill runs at their backend; killed, they become ``to`` (``None``: they stay as they are)."""
    if not indexes:
        return
    runs = core.runs_of(js, indexes)
    core.emit(SendKill(stimulus_id=sid, backend=js.profile.backend, runs=runs,
                       native=js.profile.native_kill, stop_on_failure=stop_on_failure,
                       attempts=attempts_of(js, runs)))
    core.killing[send_key(sid, runs)] = Killing(request, to, forced)
