"""The requests users make, one handler each: what is allowed, on which runs, and what to send.

Each ``begin_*`` takes one group of a request's targets (the targets in one
top-level job), checks them against docs/design.md's rules (raising ``JobError``
for a refusal, which :mod:`.flow` turns into the request's answer by
keep_going), moves what moves now, and sends the instructions whose
outcomes finish the group. It returns how many outcomes the group waits for.
"""

from __future__ import annotations

from .base import Core, Pending
from .errors import JobError
from .events import (
    AddRequested,
    ForceStatusRequested,
    KillRequested,
    MergeRequested,
    ReleaseRequested,
    RemoveRequested,
    ResubmitRequested,
    SubmitRequested,
)
from .flow import refused, register, start
from .ids import FQID
from .instructions import Forget, Prepare, RunPostprocess, SetBackend, Unwatch
from .jobs import JobState
from .partition import active_linked, resubmit_refusal, settle
from .sending import send_kill, send_submit
from .statuses import ACTIVE, AT_REST, FINAL, KILLABLE, MONITORED, RESUBMITTABLE, JobStatus, resubmitted_from


def _job(core: Core, job: int, fq: FQID) -> JobState:
    js = core.job_of(fq)
    if js is None:
        raise refused("no such job", fq)
    return js


def _is_master_target(js: JobState, fq: FQID) -> bool:
    return len(fq) == 1 and js.is_master


# ------------------------------------------------------------------ add
def handle_add(core: Core, event: AddRequested) -> None:
    """A job the runtime stored is known from now on, ``new``."""
    job = event.targets[0][0]
    js = JobState(job, event.profile, event.time, core.order)
    js.top.timestamps["new"] = event.time
    js.link = event.link
    core.jobs[job] = js
    core.reply(event.stimulus_id, acted=1)


# ------------------------------------------------------------------ submit
def begin_submit(core: Core, pending: Pending, job: int, targets: list[FQID]) -> int:
    for fq in targets:
        js = _job(core, job, fq)
        if len(fq) > 1:
            raise refused("a subjob cannot be submitted on its own (use resubmit())", fq)
        if js.status != JobStatus.NEW or js.is_master:
            raise refused(f"cannot submit a job that is {js.status.value} (use resubmit())", fq)
        event = pending.event
        if isinstance(event, SubmitRequested) and job in event.profiles:  # defined anew before its submission
            js.profile = event.profiles[job]
        if js.profile.splits:
            js.is_master = True  # no subjobs yet: it shows "submitting" while it is split
            js.attempt += 1
            core.pin(js, JobStatus.SUBMITTING, pending.sid)
        core.emit(Prepare(stimulus_id=pending.sid, job=job, submitting=not js.profile.prejob))
        pending.acted += 1
        return 1
    return 0


# ------------------------------------------------------------------ kill
def begin_kill(core: Core, pending: Pending, job: int, targets: list[FQID]) -> int:
    js = core.jobs.get(job)
    chosen: list[int] = []
    linked: list[JobState] = []
    refusal: JobError | None = None
    for fq in targets:
        try:
            js = _job(core, job, fq)
            if _is_master_target(js, fq):
                chosen += js.runs.indexes_in(KILLABLE)
                linked += active_linked(core, js)
                if submitting := js.runs.indexes_in([JobStatus.SUBMITTING]):  # retries under way: killed once out
                    core.kill_after.setdefault(job, set()).update(submitting)
                    pending.acted += len(submitting)
                continue
            i = fq[1] if len(fq) > 1 else 0
            status = js.runs.get(i)
            if status == JobStatus.NEW:
                raise refused("cannot kill a job that was never submitted", fq)
            if status in FINAL:
                continue
            if status not in KILLABLE:
                raise refused(f"cannot kill a job that is {status.value}", fq)
            chosen.append(i)
        except JobError as exc:
            refusal = exc
            if not pending.keep_going:
                break
            pending.errors.append((exc, False))
    waits = 0
    if js is not None and chosen:
        send_kill(core, js, sorted(set(chosen)), pending.sid, request=pending.sid,
                  stop_on_failure=not pending.keep_going)
        pending.acted += len(set(chosen))
        waits += 1
    for other in linked:
        send_kill(core, other, [0], pending.sid, request=pending.sid)
        pending.running[other.id] = pending.running.get(other.id, 0) + 1
        pending.acted += 1
    if refusal is not None and not pending.keep_going:
        if waits:
            pending.errors.append((refusal, False))
            return waits
        raise refusal
    return waits


# ------------------------------------------------------------------ resubmit
def begin_resubmit(core: Core, pending: Pending, job: int, targets: list[FQID]) -> int:
    event = pending.event
    assert isinstance(event, ResubmitRequested)
    js = core.jobs.get(job)
    chosen: list[int] = []
    refusal: JobError | None = None
    for fq in targets:
        try:
            js = _job(core, job, fq)
            chosen += _resubmit_targets(js, fq, event.only_failed)
        except JobError as exc:
            refusal = exc
            if not pending.keep_going:
                break
            pending.errors.append((exc, False))
    if js is None or (refusal is not None and not pending.keep_going and not chosen):
        if refusal is not None:
            raise refusal
        return 0
    if event.backend is not None:
        _change_backend(core, js, event, pending.sid)
    chosen = sorted(set(chosen))
    if js.is_master and any(len(fq) == 1 for fq in targets):
        js.attempt += 1
        core.dirty_tops.add(js.id)
    was_new = frozenset(i for i in chosen if js.runs.status[i] == JobStatus.NEW.code)
    for i in chosen:
        if (extra := js.runs.extras.get(i)) is not None:
            extra.reason = None
    if chosen and js.post_failed:  # the postprocessors judged the runs before these: they judge again at the end
        js.post_failed = False
        js.top.reason = None
        core.dirty_tops.add(js.id)
    core.move(js, chosen, JobStatus.SUBMITTING, pending.sid)
    settle(core, js, pending.sid)
    send_submit(core, js, chosen, pending.sid, kind="resubmit", request=pending.sid,
                stop_on_failure=not pending.keep_going, start=event.start, was_new=was_new)
    pending.acted += len(chosen)
    if refusal is not None and not pending.keep_going:
        pending.errors.append((refusal, False))
    return 1 if chosen else 0


def _resubmit_targets(js: JobState, fq: FQID, only_failed: bool) -> list[int]:
    if _is_master_target(js, fq):
        why = resubmit_refusal(js)
        if why is not None:
            raise refused(why, fq)
        return js.runs.indexes_in(resubmitted_from(only_failed))
    i = fq[1] if len(fq) > 1 else 0
    status = js.runs.get(i)
    if status == JobStatus.NEW and len(fq) == 1:
        raise refused("was never submitted (use submit())", fq)
    if status == JobStatus.HELD:
        raise refused("is held (use release())", fq)
    if status not in RESUBMITTABLE:
        step = "; kill it first, then resubmit it" if status in ACTIVE else ""
        raise refused(f"cannot resubmit a job that is {status.value}{step}", fq)
    return [i]


def _change_backend(core: Core, js: JobState, event: ResubmitRequested, sid: str) -> None:
    assert event.profile is not None
    if event.profile.backend != js.profile.backend:
        raise refused(f"resubmit may change the backend's settings, not its type ({js.profile.backend} -> "
                      f"{event.profile.backend})", (js.id,), "backend")
    js.profile = event.profile
    core.emit(SetBackend(stimulus_id=sid, job=js.id, backend=event.backend,
                         subjobs=len(js.runs) if js.is_master else 0))


# ------------------------------------------------------------------ release
def begin_release(core: Core, pending: Pending, job: int, targets: list[FQID]) -> int:
    event = pending.event
    assert isinstance(event, ReleaseRequested)
    chosen: list[int] = []
    js = core.jobs.get(job)
    for fq in targets:
        js = _job(core, job, fq)
        if _is_master_target(js, fq):
            held = js.runs.indexes_in([JobStatus.HELD])
            if not held:
                raise refused("has no held subjobs to release", fq)
            chosen += held
            continue
        i = fq[1] if len(fq) > 1 else 0
        if js.runs.get(i) != JobStatus.HELD:
            raise refused(f"cannot release a job that is {js.runs.get(i).value} (only held jobs)", fq)
        chosen.append(i)
    if js is None or not chosen:
        return 0
    chosen = sorted(set(chosen))
    for i in chosen:
        extra = js.runs.extra(i)
        if event.retry_args is not None:
            extra.retry_args = [str(a) for a in event.retry_args]
        extra.reason = None
    core.move(js, chosen, JobStatus.SUBMITTING, pending.sid)
    settle(core, js, pending.sid)
    send_submit(core, js, chosen, pending.sid, kind="release", request=pending.sid, start="resume")
    pending.acted += len(chosen)
    return 1


# ------------------------------------------------------------------ force_status
def begin_force(core: Core, pending: Pending, job: int, targets: list[FQID]) -> int:
    event = pending.event
    assert isinstance(event, ForceStatusRequested)
    to = event.status
    if to not in (JobStatus.FAILED, JobStatus.COMPLETED):
        raise refused(f"force_status takes 'failed' or 'completed', not {to.value!r}", targets[0], "status")
    js = core.jobs.get(job)
    now_idx: list[int] = []
    kill_idx: list[int] = []
    for fq in targets:
        js = _job(core, job, fq)
        if _is_master_target(js, fq):
            candidates = [i for i in range(len(js.runs)) if js.runs.get(i) not in FINAL]
        else:
            candidates = [fq[1] if len(fq) > 1 else 0]
        for i in candidates:
            status = js.runs.get(i)
            if status in ACTIVE and not event.force:
                if status == JobStatus.SUBMITTING:
                    raise refused("is being submitted: try again once it is submitted", fq, "status")
                kill_idx.append(i)
            else:
                now_idx.append(i)
    if js is None:
        return 0
    waits = 0
    if now_idx:
        force_now(core, js, now_idx, to, pending.sid)
        pending.acted += len(now_idx)
    if kill_idx:
        send_kill(core, js, kill_idx, pending.sid, request=pending.sid, to=to, forced=True)
        pending.acted += len(kill_idx)
        waits = 1
    return waits


def force_now(core: Core, js: JobState, indexes: list[int], to: JobStatus, sid: str, *,
              checked: str | None = None) -> None:
    """Move runs to ``to`` outside the table, on record as forced; their backend is left alone.

    ``checked``: not a user but a postprocessor's checker failed them, saying this.
    """
    watched = [i for i in indexes if js.runs.get(i) in MONITORED]
    for i in indexes:
        extra = js.runs.extra(i)
        was = js.runs.get(i)
        if checked is not None:
            entry = {"level": "postprocess", "verdict": "checked", "reason": checked}
        else:
            entry = {"level": "user", "verdict": "forced",
                     "reason": f"forced from {was.value} to {to.value} by the user"}
        extra.history = [*extra.history, {"time": core.now, **entry, "attempt": js.runs.attempt[i], "action": to.value}]
        if checked is not None:
            extra.reason = checked
        else:
            extra.reason = f"forced to {to.value} by the user" if to == JobStatus.FAILED else None
    core.move(js, indexes, to, sid, forced=True)
    if watched:
        core.emit(Unwatch(stimulus_id=sid, backend=js.profile.backend, runs=core.runs_of(js, watched)))
    settle(core, js, sid)


# ------------------------------------------------------------------ remove
def begin_remove(core: Core, pending: Pending, job: int, targets: list[FQID]) -> int:
    for fq in targets:
        js = _job(core, job, fq)
        if len(fq) > 1:
            raise refused("a subjob cannot be removed on its own (remove its master)", fq)
        if js.active() or js.status not in AT_REST:
            raise refused(f"cannot remove a job that is {js.status.value} (kill it first)", fq)
    js = core.jobs.pop(job)
    for other in core.jobs.values():  # links to it go: its master sees "removed" when its phase looks
        if other.link is not None and other.link[0] == job:
            other.link = None
    core.emit(Forget(stimulus_id=pending.sid, job=job))
    pending.acted += 1
    return 0


# ------------------------------------------------------------------ merge
def begin_merge(core: Core, pending: Pending, job: int, targets: list[FQID]) -> int:
    """Postprocessors again, on demand: only on an ended master that has some (they replace their own output)."""
    for fq in targets:
        js = _job(core, job, fq)
        if len(fq) > 1 or not js.is_master:
            raise refused("only a master's subjobs are merged (name the master)", fq)
        if not js.profile.postprocess:
            raise refused("has no merger or postprocessor to run", fq)
        if js.postprocessing or not js.all_final():
            raise refused(f"is {js.status.value}: its postprocessors run by themselves once it ends", fq)
        js.postprocessing = True
        core.dirty_tops.add(js.id)
        core.emit(RunPostprocess(stimulus_id=pending.sid, job=js.id))
        pending.acted += 1
    return 0


KINDS = {
    SubmitRequested: "submit", KillRequested: "kill", ResubmitRequested: "resubmit",
    ReleaseRequested: "release", ForceStatusRequested: "force_status", RemoveRequested: "remove",
    MergeRequested: "merge",
}
BEGINS = {"submit": begin_submit, "kill": begin_kill, "resubmit": begin_resubmit, "release": begin_release,
          "force_status": begin_force, "remove": begin_remove, "merge": begin_merge}
for _kind, _begin in BEGINS.items():
    register(_kind, _begin)


def handle_request(core: Core, event: SubmitRequested | KillRequested | ResubmitRequested | ReleaseRequested
                   | ForceStatusRequested | RemoveRequested | MergeRequested) -> None:
    kind = KINDS[type(event)]
    start(core, event, kind, BEGINS[kind])
