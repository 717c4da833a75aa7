"""What happens when a master's subjobs end, and DataGrid's pre-job -> subjobs -> aggregator gating.

``settle`` is called after every batch of moves on a job. For a master it
re-derives the status; once every subjob is final it starts the
postprocessors and, for a partitioned job, the aggregator. For a pre-job or
aggregator (a top-level job linked to its master) it shows the linked job's
status on the master or moves the master's phase on once it ended.

The pre-job and the aggregator are ordinary top-level jobs, linked from the
master's ``partition`` (``prejob``, ``aggregator``: their ids, ``phase``)
and back (``link``). Subjob ids stay ``0..N-1``. While the linked job runs,
the master shows its status (pinned: rules 1-3 with one run); once it
ended, the master is derived again, failed if the aggregator failed or was
not started. Phases: ``starting`` (the pre-job is being submitted),
``prejob`` (it runs; the subjobs wait, ``new``), ``prejob-ended`` (it
ended otherwise than completed: no subjob started), ``subjobs``,
``aggregator``, ``aggregator-ended``.
"""

from __future__ import annotations

from .base import Core
from .instructions import CreateLinked, Notify, RunPostprocess
from .jobs import JobState
from .sending import send_submit
from .statuses import AT_REST, KILLABLE, JobStatus

#: What the master shows while its linked job is in each status (rules 1-3 with one run).
SHOWN = {JobStatus.SUBMITTING: JobStatus.SUBMITTED, JobStatus.SUBMITTED: JobStatus.SUBMITTED,
         JobStatus.RUNNING: JobStatus.RUNNING, JobStatus.COMPLETING: JobStatus.RUNNING, JobStatus.HELD: JobStatus.HELD}


def settle(core: Core, js: JobState, sid: str) -> None:
    """After moves on ``js``: derive, and start what its end makes due."""
    before = js.status
    if js.is_master and core.rederive(js, sid):
        master_ended(core, js, sid)
    if js.is_master and js.profile.notify_held and js.status == JobStatus.HELD and before != JobStatus.HELD:
        core.emit(Notify(stimulus_id=sid, job=js.id, status=JobStatus.HELD))
    if js.link is not None:
        master = core.jobs.get(js.link[0])
        if master is not None:
            linked_changed(core, master, js, js.link[1], sid)


def master_ended(core: Core, js: JobState, sid: str) -> None:
    """Every subjob of a master is final: its postprocessors and its aggregator are due."""
    if js.profile.postprocess and not js.postprocessing:
        js.postprocessing = True
        core.emit(RunPostprocess(stimulus_id=sid, job=js.id))
    if js.profile.aggregator and js.partition.get("phase") != "aggregator":
        aggregate(core, js, sid)


# ------------------------------------------------------------------ pre-job
def start_prejob(core: Core, master: JobState, sid: str) -> None:
    master.partition["phase"] = "starting"
    core.dirty_tops.add(master.id)
    core.emit(CreateLinked(stimulus_id=sid, master=master.id, role="prejob"))


def linked_changed(core: Core, master: JobState, linked: JobState, role: str, sid: str) -> None:
    p = master.partition
    if p.get("phase") == f"{role}-ended" and linked.status == JobStatus.SUBMITTING:
        p["phase"] = role  # the user resubmitted the pre-job or the aggregator: its phase again
        core.dirty_tops.add(master.id)
    if p.get("phase") != role or not master.is_master:
        return
    if linked.status in AT_REST:
        if role == "prejob":
            prejob_ended(core, master, linked, sid)
        else:
            aggregator_ended(core, master, linked, sid)
    elif (shown := SHOWN.get(linked.status)) is not None and master.pinned != shown:
        core.pin(master, shown, sid)


def prejob_ended(core: Core, master: JobState, prejob: JobState, sid: str) -> None:
    p = master.partition
    if prejob.status == JobStatus.COMPLETED:
        p["phase"] = "subjobs"
        waiting = master.runs.indexes_in([JobStatus.NEW])
        master.top.reason = None
        core.move(master, waiting, JobStatus.SUBMITTING, sid)
        send_submit(core, master, waiting, sid, kind="after-prejob", start="initial")
    else:
        p["phase"] = "prejob-ended"
        reason = prejob.runs.extras.get(0)
        why = f": {reason.reason}" if reason is not None and reason.reason else ""
        master.top.reason = f"prejob {prejob.id} {prejob.status.value}{why}; no subjob was started"
    core.dirty_tops.add(master.id)
    unpin(core, master, sid)


def resubmit_refusal(master: JobState) -> str | None:
    """Why the subjobs may not be resubmitted now (the pre-job runs, or failed), or ``None``."""
    p = master.partition
    phase, prejob = p.get("phase"), p.get("prejob")
    if prejob is None:
        return None
    if phase in ("starting", "prejob"):
        return f"its prejob {prejob} has not completed: the subjobs start once it completes"
    if phase == "prejob-ended":
        return f"its prejob {prejob} did not complete: resubmit the prejob (the subjobs start once it completes)"
    return None


# ---------------------------------------------------------------- aggregator
def aggregate(core: Core, master: JobState, sid: str) -> None:
    """Start (or start again) the aggregator, if enough subjobs reached a final state."""
    p = master.partition
    n = len(master.runs)
    labels = []
    for i in range(n):
        extra = master.runs.extras.get(i)
        if extra is not None and extra.checkpoint.get("final"):
            labels.append(str(extra.checkpoint.get("label", f"{master.id}.{i}:{extra.checkpoint.get('seq', 0)}")))
    p.update(aggregated=core.now, failed=False)
    core.dirty_tops.add(master.id)
    if len(labels) < master.profile.min_success * n - 1e-9:
        fail(core, master, f"only {len(labels)} of {n} subjobs reached a final state "
                           f"(min_success={master.profile.min_success:g}); the aggregator was not started", sid)
        return
    p["phase"] = "aggregator"
    core.pin(master, JobStatus.SUBMITTED, sid)
    core.emit(CreateLinked(stimulus_id=sid, master=master.id, role="aggregator", steps=tuple(labels),
                           reuse=p.get("aggregator")))


def aggregator_ended(core: Core, master: JobState, aggregator: JobState, sid: str) -> None:
    p = master.partition
    p["phase"] = "aggregator-ended"
    core.dirty_tops.add(master.id)
    if aggregator.status == JobStatus.COMPLETED:
        p["failed"] = False
        if not master.post_failed:
            master.top.reason = None
        unpin(core, master, sid)
    else:
        extra = aggregator.runs.extras.get(0)
        why = f": {extra.reason}" if extra is not None and extra.reason else ""
        fail(core, master, f"aggregator {aggregator.id} {aggregator.status.value}{why}", sid)


def fail(core: Core, master: JobState, reason: str, sid: str) -> None:
    master.partition.update(failed=True, phase="aggregator-ended")
    master.top.reason = reason
    core.dirty_tops.add(master.id)
    unpin(core, master, sid)


def unpin(core: Core, master: JobState, sid: str) -> None:
    """Derive the master again; its subjobs' end was taken care of already (no second postprocessing)."""
    core.pin(master, None, sid)


def active_linked(core: Core, master: JobState) -> list[JobState]:
    """The master's pre-job or aggregator while it can be killed (a master's kill ends it too)."""
    out = []
    for role in ("prejob", "aggregator"):
        linked = core.jobs.get(master.partition.get(role, -1))
        if linked is not None and linked.status in KILLABLE:
            out.append(linked)
    return out
