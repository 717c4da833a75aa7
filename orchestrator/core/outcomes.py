"""The runtime's answers to instructions: what each outcome makes of the runs, and of the request.

Submission (docs/design.md, "Submission, keep_going, bulk"):

- accepted runs are ``submitted`` and monitored to the end, whatever happens
  to their siblings;
- a run the backend rejected is ``failed`` under native bulk (its failure is
  the backend's answer) and left ``new`` under emulated bulk (it may simply
  be submitted again); a resubmitted run that was ``new`` stays ``new``, one
  that had run is ``failed``; retries and releases are ``failed``; a job
  that runs itself is left ``new``;
- runs not attempted (an emulated series stopped at its first failure) are
  ``new``, their attempt not counted;
- a master none of whose subjobs went out is rolled back: ``new`` with no
  subjobs, nothing of the attempt left, and the request fails whatever
  keep_going says; otherwise the request fails on any rejection unless
  keep_going.
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Core, Sending, positions, send_key
from .errors import JobError
from .events import (
    KillOutcomes,
    LinkedAdded,
    LookupOutcomes,
    PostprocessDone,
    Prepared,
    PrepareFailed,
    RunReport,
    SubmitOutcomes,
)
from .flow import done, release_waiting
from .ids import fqid_str
from .instructions import Forget, Persist, Prepare, ScheduleRetry, Unprepare
from .jobs import JobState
from .partition import SHOWN, settle
from .requests import force_now
from .retry import judge
from .sending import send_kill, send_submit
from .statuses import FINAL, JobStatus
from .step import Change

#: Seconds before an automatic retry the backend refused is sent again (see :func:`_retry_refused`).
RETRY_REFUSED_AFTER = 2.0


# ------------------------------------------------------------------ prepare
def handle_prepared(core: Core, event: Prepared) -> None:
    js = core.jobs.get(event.job)
    pending = core.pending.get(event.stimulus_id)
    if js is None:
        return
    sid = event.stimulus_id
    stop = pending is not None and not pending.keep_going
    if event.n_subjobs == 0:
        core.move(js, [0], JobStatus.SUBMITTING, sid)
        send_submit(core, js, [0], sid, kind="submit", request=sid, start="initial")
        return
    js.split(event.n_subjobs)
    js.pinned = JobStatus.SUBMITTING
    if js.profile.prejob:
        from .partition import start_prejob

        start_prejob(core, js, sid)
        return
    if js.profile.aggregator:
        js.partition["phase"] = "subjobs"
    everything = range(event.n_subjobs)
    # The runtime stored them as submitting, attempt 1 (the write-ahead record): the same move here.
    core.move(js, everything, JobStatus.SUBMITTING, sid)
    core.dirty.pop(js.id, None)
    send_submit(core, js, everything, sid, kind="submit", request=sid, stop_on_failure=stop, start="initial",
                persist=False)


def handle_prepare_failed(core: Core, event: PrepareFailed) -> None:
    js = core.jobs.get(event.job)
    if js is None:
        return
    _roll_back(core, js, event.stimulus_id, undo=False)
    # The job is new again on disk before anyone hears that its submission failed: the write-ahead record of
    # its submission (a master-to-be) is not left for a reader of the repository to find.
    core.emit(Persist(stimulus_id=event.stimulus_id))
    if js.link is not None:
        _linked_submitted(core, js, [event.error], event.stimulus_id)
        return
    done(core, event.stimulus_id, event.job, [event.error], hard=True)


def _roll_back(core: Core, js: JobState, sid: str, *, undo: bool = True) -> None:
    """A submission that left nothing submitted: the job is ``new`` again, with nothing of it left."""
    if js.is_master:
        before = js.status
        js.unsplit()
        js.attempt = max(js.attempt - 1, 0)
        core.step.changes.append(Change(js.id, None, before, JobStatus.NEW, core.now, sid))
    else:
        js.runs.forget(0)  # as it was before: a new job has no reason nor history
    core.mark(js.id)
    if undo:
        core.emit(Unprepare(stimulus_id=sid, job=js.id))


# ------------------------------------------------------------------ submit
def handle_submit_outcomes(core: Core, event: SubmitOutcomes) -> None:
    sid = event.stimulus_id
    js = core.jobs.get(event.runs.job)
    # a part names its instruction by that instruction's first run (its own runs are the part's)
    key = send_key(sid, event.runs) if event.first is None else (sid, event.runs.job, event.first)
    sending = core.sending.get(key) if event.more else core.sending.pop(key, None)
    if js is None or sending is None:
        return
    idx = positions(js, event.runs)
    accepted = [idx[k] for k in event.accepted] if js.is_master else ([0] if event.accepted else [])
    for k, state in event.states.items():
        i = idx[k] if js.is_master else 0
        js.runs.save_state(i, state)
        core.mark(js.id, [i])
    core.move(js, accepted, JobStatus.SUBMITTED, sid)
    failures: list[tuple[str, str]] = []
    to_new: list[int] = [idx[k] for k in event.not_attempted] if js.is_master else (
        [0] if event.not_attempted else [])
    to_failed: list[int] = []
    refused_retries: list[tuple[int, str]] = []
    for k, why in event.rejected:
        i = idx[k] if js.is_master else 0
        reason = why or "submission refused"
        js.runs.extra(i).reason = f"submission failed: {reason}"
        failures.append((_fq(js, i), reason))
        if sending.kind == "retry":
            refused_retries.append((i, reason))
            continue
        (to_new if _rejected_to(js, i, sending, event.native) == JobStatus.NEW else to_failed).append(i)
    if refused_retries:
        to_failed += _retry_refused(core, js, refused_retries, sid)
    core.move(js, to_new, JobStatus.NEW, sid)
    core.move(js, to_failed, JobStatus.FAILED, sid)
    sending.failures += failures
    if event.more:  # a part: the request is answered with the last one
        settle(core, js, sid)
        _kill_if_asked(core, js, accepted, sid)
        return
    errors = _submit_errors(core, js, sending, sending.failures, sid)
    settle(core, js, sid)
    _kill_if_asked(core, js, accepted, sid)
    if js.link is not None and sending.kind in ("submit", "relink"):
        _linked_submitted(core, js, errors, sid)
        return
    hard = sending.kind == "release" or (sending.kind == "submit" and js.status == JobStatus.NEW)
    done(core, sending.request, js.id, errors, hard=hard)
    release_waiting(core)  # requests that waited for this submission's answer


def _retry_refused(core: Core, js: JobState, refused: list[tuple[int, str]], sid: str) -> list[int]:
    """An automatic retry the backend refused (unreachable, as a rule: the fault that made a run lost lasts) is
    judged as the backend's fault, like a lost run: while the limits allow, it stays ``submitting`` and is sent
    again after :data:`RETRY_REFUSED_AFTER` seconds (``ScheduleRetry``); the others are returned, to fail."""
    again: list[int] = []
    failed: list[int] = []
    for i, reason in refused:
        report = RunReport(core.runs_of(js, [i]), JobStatus.FAILED, reason=f"submission failed: {reason}",
                           verdict="lost")
        (again if judge(js, i, report, core.now).retry else failed).append(i)
    if again:
        core.mark(js.id, again)
        core.emit(ScheduleRetry(stimulus_id=sid, runs=core.runs_of(js, again), at=core.now + RETRY_REFUSED_AFTER))
    return failed


def _rejected_to(js: JobState, i: int, sending: Sending, native: bool) -> JobStatus:
    if sending.kind in ("submit", "after-prejob"):
        return JobStatus.FAILED if native and js.is_master else JobStatus.NEW
    if sending.kind == "resubmit":
        return JobStatus.NEW if i in sending.was_new else JobStatus.FAILED
    return JobStatus.FAILED


def _submit_errors(core: Core, js: JobState, sending: Sending, failures: list[tuple[str, str]],
                   sid: str) -> list[JobError]:
    """What the request is told, and the rollback of a submission that left nothing submitted."""
    if sending.kind == "submit" and not js.is_master:
        if failures:
            _roll_back(core, js, sid)
            return [JobError(f"submission failed: {failures[0][1]}", fqid=_fq(js, 0))]
        return []
    if sending.kind == "after-prejob":
        if failures and js.runs.counts[JobStatus.NEW.code] == len(js.runs):
            js.top.reason = f"no subjob could be submitted after the prejob; first error: {failures[0][1]}"
        return []
    if sending.kind == "submit":
        if js.runs.counts[JobStatus.NEW.code] == len(js.runs):
            first = failures[0][1] if failures else "?"
            _roll_back(core, js, sid)
            return [JobError(f"no subjob could be submitted; first error: {first}", fqid=fqid_str((js.id,)))]
        if js.pinned == JobStatus.SUBMITTING:
            core.pin(js, None, sid)
        pending = core.pending.get(sending.request or "")
        if failures and pending is not None and not pending.keep_going:
            fq, why = failures[0]
            return [JobError(f"{len(failures)} subjob(s) failed to submit; first, {fq}: {why}",
                             fqid=fqid_str((js.id,)))]
        return []
    if sending.kind == "release" and failures:
        fq, why = failures[0]
        return [JobError(f"release: {len(failures)} submission(s) failed; first, {fq}: {why}",
                         fqid=fqid_str((js.id,)))]
    return [JobError(reason, fqid=fq) for fq, reason in failures]


def _kill_if_asked(core: Core, js: JobState, accepted: Sequence[int], sid: str) -> None:
    """Runs a kill asked for while they were being submitted are killed now they are out."""
    asked = core.kill_after.get(js.id)
    if not asked:
        return
    now = [i for i in accepted if i in asked]
    asked.difference_update(accepted)
    if not asked:
        core.kill_after.pop(js.id, None)
    send_kill(core, js, now, sid)


def _linked_submitted(core: Core, linked: JobState, errors: list[JobError], sid: str) -> None:
    """The pre-job's or aggregator's own submission came back: go on with its master, or fail it."""
    assert linked.link is not None
    master = core.jobs.get(linked.link[0])
    if master is None:
        return
    if linked.link[1] == "aggregator":
        if errors:
            from .partition import fail

            fail(core, master, f"the aggregator could not be submitted: {errors[0]}", sid)
        else:
            settle(core, linked, sid)
        return
    prejob = linked
    if errors:  # nothing of the attempt stays: neither the pre-job nor the split
        core.jobs.pop(prejob.id, None)
        core.emit(Forget(stimulus_id=sid, job=prejob.id))
        master.partition.pop("prejob", None)
        master.partition.pop("phase", None)
        _roll_back(core, master, sid)
        error = JobError(f"the prejob could not be submitted: {errors[0]}", fqid=fqid_str((master.id,)))
        done(core, sid, master.id, [error], hard=True)
        return
    master.partition["phase"] = "prejob"
    core.dirty_tops.add(master.id)
    shown = SHOWN.get(prejob.status)
    if shown is not None:
        core.pin(master, shown, sid)
    settle(core, prejob, sid)
    done(core, sid, master.id)


# ------------------------------------------------------------------ kill
def handle_kill_outcomes(core: Core, event: KillOutcomes) -> None:
    sid = event.stimulus_id
    js = core.jobs.get(event.runs.job)
    killing = core.killing.pop(send_key(sid, event.runs), None)
    if js is None or killing is None:
        return
    idx = positions(js, event.runs)
    killed = [idx[k] for k in event.killed] if js.is_master else ([0] if event.killed else [])
    errors = [JobError(reason or "kill failed", fqid=_fq(js, idx[k] if js.is_master else 0))
              for k, reason in event.failed]
    if killing.to is not None and killing.forced:
        still = [i for i in killed if js.runs.get(i) not in FINAL]
        force_now(core, js, still, killing.to, sid)
    elif killing.to is not None:
        core.move(js, killed, killing.to, sid)  # a run that ended meanwhile keeps its ending
        settle(core, js, sid)
    if killed and killing.request is not None:
        # on record before the request is answered: a process killed the moment after finds them killed, and
        # neither takes a killed run's end by its signal for a crash nor starts one that waited its turn
        core.emit(Persist(stimulus_id=sid))
    done(core, killing.request, js.id, errors)


# ------------------------------------------------------------------ lookup
def handle_lookup_outcomes(core: Core, event: LookupOutcomes) -> None:
    """Runs a crash caught mid-submission: found at the backend, adopted; never got, sent again (same key)."""
    sid = event.stimulus_id
    js = core.jobs.get(event.runs.job)
    if js is None:
        return
    idx = positions(js, event.runs)
    found = [idx[k] for k in event.found if js.runs.get(idx[k]) == JobStatus.SUBMITTING]
    absent = [idx[k] for k in event.absent if js.runs.get(idx[k]) == JobStatus.SUBMITTING]
    core.move(js, found, JobStatus.SUBMITTED, sid)
    send_submit(core, js, absent, sid, kind="resend", persist=False)
    settle(core, js, sid)


# ------------------------------------------------------------------ linked jobs
def handle_linked_added(core: Core, event: LinkedAdded) -> None:
    """The pre-job or aggregator exists: register it and submit it under the request (or step) that asked."""
    master = core.jobs.get(event.master)
    if master is None:
        return
    sid = event.stimulus_id
    js = core.jobs.get(event.job)
    if js is None:
        js = JobState(event.job, event.profile, event.time, core.order)
        js.top.timestamps["new"] = event.time
        core.jobs[event.job] = js
    js.link = (event.master, event.role)
    master.partition[event.role] = event.job
    core.dirty_tops.update((master.id, js.id))
    if js.status == JobStatus.NEW:
        core.emit(Prepare(stimulus_id=sid, job=js.id))
        return
    core.move(js, [0], JobStatus.SUBMITTING, sid)  # a later round of the aggregator: the same job, new steps
    send_submit(core, js, [0], sid, kind="relink", start="initial")
    settle(core, js, sid)


# ------------------------------------------------------------------ postprocessing
def handle_postprocess_done(core: Core, event: PostprocessDone) -> None:
    js = core.jobs.get(event.job)
    if js is None:
        return
    sid = event.stimulus_id
    js.merged_at = event.time
    js.post_failed = event.error is not None
    if event.error is not None or not js.partition.get("failed"):
        js.top.reason = event.error
    for i, why in event.failed_subjobs:
        if js.runs.get(i) == JobStatus.COMPLETED:
            force_now(core, js, [i], JobStatus.FAILED, sid, checked=why)  # still postprocessing: not run a second time
    js.postprocessing = False
    core.dirty_tops.add(js.id)
    core.rederive(js, sid)


def _fq(js: JobState, i: int) -> str:
    return f"{js.id}.{i}" if js.is_master else str(js.id)
