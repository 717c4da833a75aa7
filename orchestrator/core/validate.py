"""The core's own invariants, checked on demand (Dask's ``WorkerState.validate_state()``).

The handlers keep redundant state for speed: per-status counters beside the
status bytes, a master's derived status beside its subjobs, links both ways
between a master and its pre-job or aggregator, requests in ``pending``
beside the jobs they hold in ``busy``. A handler that forgets one half of
an update leaves the state wrong without any visible failure until much
later; :func:`validate` finds such a slip right after the event that made it,
naming the job and what disagrees. The property test calls it after every
step; it reads every run once (C-speed scans over the arrays), so it costs
little next to the events it checks.
"""

from __future__ import annotations

from typing import NoReturn

from .base import Core
from .jobs import JobState
from .partition import SHOWN
from .statuses import ACTIVE, ALL_STATUSES, JobStatus
from .table import RunTable, saved_by

#: A run in one of these was submitted at least once, so its attempt counter is at least 1. (Final runs may
#: have 0: ``force_status`` moves a run that was never submitted.)
SUBMITTED_ONCE = frozenset({*ACTIVE, JobStatus.HELD})
#: What a master may show while something stands in for its subjobs (a submission, its pre-job or aggregator).
PINNABLE = frozenset({JobStatus.SUBMITTING, *SHOWN.values()})
#: A partitioned master's phases (see :mod:`.partition`).
PHASES = frozenset({"starting", "prejob", "prejob-ended", "subjobs", "aggregator", "aggregator-ended"})
ROLES = frozenset({"prejob", "aggregator"})


class InvalidState(AssertionError):
    """The core's state contradicts itself; the message names the job and what disagrees."""


def validate(core: Core) -> None:
    """Raise :class:`InvalidState` at the first invariant that does not hold."""
    for job_id, js in core.jobs.items():
        if js.id != job_id:
            _fail(job_id, f"is stored under id {job_id} but says it is job {js.id}")
        _validate_table(job_id, js.runs)
        _validate_job(core, js)
    _validate_requests(core)


def _fail(job: int | str, what: str) -> NoReturn:
    """Raise, naming the job (the messages are only built once something is wrong: the checks run often)."""
    raise InvalidState(f"job {job}: {what}")


def _validate_table(job: int, runs: RunTable) -> None:
    n = len(runs.status)
    if len(runs.attempt) != n:
        _fail(job, f"{len(runs.attempt)} attempt counters for {n} runs")
    for kind, times in runs.times.items():
        if len(times) != n:
            _fail(job, f"{len(times)} {kind!r} times for {n} runs")
    if len(runs.counts) != len(ALL_STATUSES):
        _fail(job, f"{len(runs.counts)} status counters")
    status = runs.status
    if n == 1:  # most jobs run themselves: one look instead of a count per status
        code = status[0]
        if code >= len(ALL_STATUSES) or runs.counts[code] != 1 or sum(runs.counts) != 1:
            _fail(job, f"its one run has status code {code}, its counters say {runs.counts}")
    else:
        for code, counted in enumerate(runs.counts):
            if counted != status.count(code):
                _fail(job, f"counts {counted} runs {ALL_STATUSES[code].value}, the statuses {status.count(code)}")
        if sum(runs.counts) != n:
            _fail(job, f"{n - sum(runs.counts)} runs have no known status code")
    if runs.extras and (stray := [i for i in runs.extras if not 0 <= i < n]):
        _fail(job, f"extras for runs {stray[:5]} beyond its {n} runs")
    if runs.saved != (saved := saved_by(runs.extras)):
        _fail(job, f"runs {sorted(runs.saved ^ saved)[:5]} disagree on whether they saved a state")
    if 0 in runs.attempt:  # a C scan; only then the runs that must have been submitted are looked at
        for i in runs.indexes_in(SUBMITTED_ONCE):
            if runs.attempt[i] < 1:
                _fail(job, f"run {i} is {runs.get(i).value} with attempt {runs.attempt[i]} "
                           "(it was submitted: at least 1)")


def _validate_job(core: Core, js: JobState) -> None:
    job = js.id
    if js.attempt < 0:
        _fail(job, f"its own submit counter is {js.attempt}")
    if not js.is_master:
        if len(js.runs) != 1:
            _fail(job, f"runs itself but has {len(js.runs)} runs")
        if js.pinned is not None:
            _fail(job, f"runs itself but is pinned to {js.pinned}")
        if js.postprocessing or js.post_failed:
            _fail(job, "runs itself but has postprocessing state")
    else:
        if len(js.runs) < 1:
            _fail(job, "is a master without subjobs")
        if js.pinned is None:
            derived = js.derive()
            if js.derived != derived:
                _fail(job, f"shows {js.derived.value} but its subjobs {_counts(js)} derive {derived.value}")
        elif js.pinned not in PINNABLE:
            _fail(job, f"is pinned to {js.pinned.value}")
    phase = js.partition.get("phase")
    if phase is not None and phase not in PHASES:
        _fail(job, f"has an unknown phase {phase!r}")
    if js.link is not None:
        master_id, role = js.link
        if role not in ROLES:
            _fail(job, f"is linked as {role!r}")
        master = core.jobs.get(master_id)
        if master is not None and master.partition.get(role) != job:
            _fail(job, f"is {master_id}'s {role}, but {master_id} names {master.partition.get(role)!r}")
    for role in ROLES if js.partition else ():
        linked = core.jobs.get(js.partition.get(role, -1))
        if linked is not None and linked.link != (job, role):
            _fail(job, f"names {linked.id} as its {role}, but {linked.id} is linked as {linked.link}")


def _counts(js: JobState) -> str:
    return ", ".join(f"{n} {s.value}" for s, n in js.counts().items()) or "none"


def _validate_requests(core: Core) -> None:
    for job, sid in core.busy.items():
        if sid not in core.pending:
            _fail(job, f"is held by request {sid}, which is not under way")
    for sid, pending in core.pending.items():
        if pending.sid != sid:
            _fail(sid, f"a request is stored under {sid} but is {pending.sid}")
        if not (pending.todo or pending.running):
            _fail(sid, "a request under way has nothing left to do nor wait for")
    for key, killing in core.killing.items():
        if killing.request is not None and killing.request not in core.pending:
            _fail(key[1], f"a kill answers request {killing.request}, which is not under way")
    for job, indexes in core.kill_after.items():
        js = core.jobs.get(job)
        if js is not None and (stray := [i for i in indexes if not 0 <= i < len(js.runs)]):
            _fail(job, f"is to kill runs {sorted(stray)[:5]} it does not have")
    if core.waiting and not core.pending and not core.sending:
        # Waiting requests are taken again when a request is answered or a submission's outcome comes back: with
        # neither under way, nothing would ever start them.
        _fail(core.waiting[0][0].stimulus_id, "a request waits while nothing is under way that would start it")


__all__ = ["InvalidState", "validate"]
