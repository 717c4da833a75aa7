"""How a request moves through its targets: keep_going, serialisation, and the reply.

A request names targets (jobs and subjobs, in the order given). They are
grouped by top-level job; each group is *begun* by the request kind's
handler, which either settles it at once (a refusal, a no-op) or sends
instructions whose outcomes come back later as events. With
``keep_going=True`` every group is begun at once and refusals are collected;
with ``keep_going=False`` groups go one after the other and the first error
stops the rest (what was done before it stays done). Once nothing is left
under way, the request is answered with a ``Reply``.

Two requests on the same top-level job never interleave: a request that
finds one of its jobs held by another waits, and is handled again, in
arrival order, when that one is answered.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from .base import Core, Pending
from .errors import JobError
from .events import Request
from .ids import FQID, fqid_str

#: A kind's handler for one group: returns how many instructions it is waiting for (0: settled now).
Begin = Callable[[Core, Pending, int, list[FQID]], int]
#: Kinds whose error always names the request ("kill stopped: ..."), as a user of a slice reads it.
STOPPED = frozenset({"kill", "resubmit"})
#: Kinds whose refusals are raised whatever keep_going says (keep_going is about runs, not about asking
#: to submit a job twice).
HARD_REFUSALS = frozenset({"submit", "release", "remove"})


def groups(targets: tuple[FQID, ...]) -> deque[tuple[int, list[FQID]]]:
    """Targets grouped by top-level job, in first-seen order."""
    out: dict[int, list[FQID]] = {}
    for fq in targets:
        out.setdefault(fq[0], []).append(fq)
    return deque(out.items())


def start(core: Core, event: Request, kind: str, begin: Begin) -> None:
    """Take a request: wait if one of its jobs is held, else begin its groups."""
    todo = groups(event.targets)
    if any(core.occupied(job) for job, _ in todo):
        core.waiting.append((event, kind))
        return
    pending = Pending(event, kind, todo)
    core.pending[event.stimulus_id] = pending
    for job, _ in todo:
        core.busy[job] = event.stimulus_id
    advance(core, pending, begin)


_BEGINS: dict[str, Begin] = {}


def register(kind: str, begin: Begin) -> None:
    _BEGINS[kind] = begin


def advance(core: Core, pending: Pending, begin: Begin | None = None) -> None:
    """Begin the groups the rules allow now; answer the request when nothing is left under way."""
    begin = begin or _BEGINS[pending.kind]
    while pending.todo:
        if not pending.keep_going and (pending.running or pending.errors):
            break
        job, targets = pending.todo.popleft()
        try:
            waiting = begin(core, pending, job, targets)
        except JobError as exc:
            pending.errors.append((exc, pending.kind in HARD_REFUSALS))
            core.busy.pop(job, None)
            continue
        if waiting:
            pending.running[job] = pending.running.get(job, 0) + waiting
        else:
            core.busy.pop(job, None)
    if not pending.keep_going and pending.errors:
        for job, _ in pending.todo:
            core.busy.pop(job, None)
        pending.todo.clear()
    if not pending.todo and not pending.running:
        finish(core, pending)


def done(core: Core, sid: str | None, job: int, errors: Sequence[JobError] = (), *, hard: bool = False) -> None:
    """One instruction of a request's group was answered; go on with the request.

    ``hard``: the errors are raised whatever keep_going says.
    """
    pending = core.pending.get(sid) if sid is not None else None
    if pending is None:
        return
    pending.errors.extend((e, hard) for e in errors)
    left = pending.running.get(job, 0) - 1
    if left > 0:
        pending.running[job] = left
        return
    pending.running.pop(job, None)
    core.busy.pop(job, None)
    advance(core, pending)


def finish(core: Core, pending: Pending) -> None:
    core.pending.pop(pending.sid, None)
    for job, holder in list(core.busy.items()):
        if holder == pending.sid:
            del core.busy[job]
    core.reply(pending.sid, summary(pending), pending.acted)
    release_waiting(core)


def summary(pending: Pending) -> JobError | None:
    """The one error the request raises: its first, named as the user asked (one job, or a slice).

    With keep_going, only the errors raised whatever keep_going says count.
    """
    raised = [e for e, hard in pending.errors if hard or not pending.keep_going]
    if not raised:
        return None
    first = raised[0]
    if pending.kind in STOPPED or len(pending.event.targets) > 1:
        error = JobError(f"{pending.kind} stopped: {first}")
        error.fqid, error.field = first.fqid, first.field
        return error
    return first


def release_waiting(core: Core) -> None:
    """Requests that waited for a job now free are taken again, in arrival order."""
    if not core.waiting:
        return
    waiting, core.waiting = core.waiting, deque()
    for event, kind in waiting:
        start(core, event, kind, _BEGINS[kind])


def refused(message: str, fq: FQID, field: str | None = None) -> JobError:
    return JobError(message, fqid=fqid_str(fq), field=field)
