"""A story per job: the recent steps, kept as the core made them, told for one job or subjob on demand.

As Dask's ``WorkerState.story()``: when a run did something nobody expected
(lost, retried, killed twice), the question is *what happened to it, and
why*, and the answer is the stimuli that touched it, in order, with the
stimulus ids that tie a request to its instructions, the backend's reports
and the changes they made.

The bus hands every step to :meth:`Story.record`, which only appends the
event and its :class:`~orchestrator.core.step.Step` (objects the core made
anyway) to a bounded deque: no string is formatted, no run looked at, on the
path a million subjobs take, but what a step keeps is made compact first
(:func:`_kept`): a batch's index, attempt and position lists become a
``range`` or an array of as few bytes a number as they
need, and what no story tells (a report's log and states, a reply's value, a
submission's retry arguments and starting states) is let go of. Kept as they
came, ten thousand steps of a million subjobs held every chunk's arrays several
times over (about 110 MiB at a million). Steps that did nothing (a monitoring tick that
found every run as it was: a status report that changed nothing) are not
kept, so an idle backend polled five times a second does not push a job's
history out; every other event is (a kill's outcome on a run that moved on
changes nothing, and still belongs to its story). :meth:`Story.of` filters
and describes only when a story is asked for.

What touches a job: for a subjob ``3.1``, every event, change, refusal and
instruction whose runs include it, and requests naming its master (a kill of
``3`` kills ``3.1``); for a top-level job ``3``, those about the job itself
(its own status, requests naming it, its preparation, its postprocessors),
not its subjobs' batches (``story 3.1`` tells those). The event of a step is
told whenever anything of the step touched the job, so no change appears
without its cause.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from ..core import events, instructions
from ..core.events import Event
from ..core.ids import FQID, Runs, as_range
from ..core.instructions import Instruction
from ..core.step import Change, Refusal, Step

#: One entry of a story, as every transport carries it: ``stimulus_id``, ``time`` (epoch seconds), ``kind``
#: (``event``, ``change``, ``refusal``, ``instruction``), ``type`` (the class) and ``description``.
Entry = dict[str, Any]
#: Reports kept only when they changed something: a report of what the core knew already, or a backend's silence
#: not yet long enough to make a run lost, is no step of any story.
_QUIET = frozenset({events.StatusReport, events.RunsSilent})


class Story:
    """The last ``capacity`` steps that did something (see the module docstring)."""

    def __init__(self, capacity: int, *, compact: bool = True) -> None:
        #: ``compact=False`` keeps each step as the core made it (to compare what a compact story tells against).
        self._compact = compact
        self._steps: deque[tuple[Event, Step]] = deque(maxlen=capacity)

    def record(self, event: Event, step: Step) -> None:
        """The bus's hook: a type test (a truth test for a report) and an append per step, nothing more."""
        if step or type(event) not in _QUIET:
            if self._compact:
                event, step = _kept(event), Step(step.stimulus_id, [_kept_change(c) for c in step.changes],
                                                 step.refusals, [_kept(i) for i in step.instructions])
            self._steps.append((event, step))

    def steps(self) -> list[tuple[Event, Step]]:
        """The kept steps, oldest first, in the form they are kept in (for debugging, as Dask's ``story``)."""
        return list(self._steps)

    def __len__(self) -> int:
        return len(self._steps)

    def of(self, fq: FQID) -> list[Entry]:
        """Every kept entry that touched ``fq``, oldest first."""
        out: list[Entry] = []
        for event, step in list(self._steps):
            out.extend(_told(event, step, fq))
        return out


# ------------------------------------------------------------------ what a kept step holds
#: Fewer numbers than this are kept as they came (a list of a few is no larger than an array of them).
_SMALL = 32
#: Fields of events and instructions that hold a number per run (an index's attempt, a position in ``runs``).
_PER_RUN = ("attempts", "accepted", "not_attempted", "killed", "found", "absent")
#: Fields no story tells, with what a kept step holds instead.
_UNTOLD: tuple[tuple[str, Any], ...] = (("states", {}), ("retry_args", {}), ("value", None))
_Item = TypeVar("_Item")


def _packed(values: Sequence[int]) -> Sequence[int]:
    """Whole numbers in the least memory that tells them: a ``range`` when consecutive, else an array of one or four
    bytes a number (as they came when they need more; a batch's attempts, one small value repeated, take a byte
    each). A pass in C, per batch."""
    if len(values) < _SMALL or isinstance(values, range):
        return values
    whole = as_range(values)
    if whole is not None:
        return whole
    for code in ("B", "I"):
        try:
            return array(code, values)
        except OverflowError:
            continue
    return values


def _kept_runs(runs: Runs) -> Runs:
    indexes = runs.indexes
    if indexes is None:
        return runs
    packed = _packed(indexes)
    return runs if packed is indexes else Runs(runs.job, packed)


def _kept_change(change: Change) -> Change:
    indexes = change.indexes
    if indexes is None:
        return change
    packed = _packed(indexes)
    return change if packed is indexes else replace(change, indexes=packed)


def _kept(item: _Item) -> _Item:
    """An event or instruction as a story keeps it: its batches packed, what no story tells let go of."""
    changes: dict[str, Any] = {}
    runs = getattr(item, "runs", None)
    if isinstance(runs, Runs) and (kept := _kept_runs(runs)) is not runs:
        changes["runs"] = kept
    for name in _PER_RUN:
        values = getattr(item, name, None)
        if values is not None and (packed := _packed(values)) is not values:
            changes[name] = packed
    for name, empty in _UNTOLD:
        if getattr(item, name, None):
            changes[name] = empty
    if isinstance(item, events.StatusReport):
        reports = tuple(_kept_report(r) for r in item.reports)
        if any(kept is not given for kept, given in zip(reports, item.reports, strict=True)):
            changes["reports"] = reports
    return replace(item, **changes) if changes else item  # type: ignore[type-var]


def _kept_report(report: events.RunReport) -> events.RunReport:
    """A run's report as a story tells it: its status, exit code, verdict and reason (not its log, states, usage);
    the report itself when it holds nothing more (its batch packed once, here)."""
    runs = _kept_runs(report.runs)
    if runs is report.runs and report.log is None and report.state is None and report.usage is None \
            and report.stderr_tail is None:
        return report
    # made whole, not by replace(): one a run, and replace() looks each field up again (what no story tells is left out)
    return events.RunReport(runs=runs, status=report.status, exit_code=report.exit_code, reason=report.reason,
                            verdict=report.verdict, started=report.started, ended=report.ended)


# ------------------------------------------------------------------ what touches a job
def _position(runs: Runs, fq: FQID) -> int | None:
    """Where ``fq`` is in ``runs`` (a position, as outcomes name runs), or ``None`` when it is not in them."""
    if runs.job != fq[0]:
        return None
    indexes = runs.indexes
    if indexes is None:
        return 0 if len(fq) == 1 else None
    if len(fq) == 1:
        return None
    try:
        return indexes.index(fq[1])  # a range answers at once; an array searches in C
    except ValueError:
        return None


def _named(targets: Sequence[FQID], fq: FQID) -> bool:
    """A request names ``fq``, or (for a subjob) its master."""
    return fq in targets or (len(fq) > 1 and fq[:1] in targets)


def _job_field(item: object, fq: FQID) -> bool:
    """An event or instruction about a whole job (``job``, ``master``) is about ``fq`` when ``fq`` is that job."""
    return len(fq) == 1 and fq[0] in (getattr(item, "job", None), getattr(item, "master", None))


def _event_touches(event: Event, fq: FQID) -> bool:
    if isinstance(event, events.Request):
        return _named(event.targets, fq)
    if isinstance(event, events.StatusReport):
        return any(_position(r.runs, fq) is not None for r in event.reports)
    runs = getattr(event, "runs", None)
    if isinstance(runs, Runs):
        return _position(runs, fq) is not None
    if isinstance(event, events.Prepared) and len(fq) == 2:  # it made the subjob
        return fq[0] == event.job and fq[1] < event.n_subjobs
    if isinstance(event, events.PostprocessDone) and len(fq) == 2:  # a checker failed the subjob
        return fq[0] == event.job and any(i == fq[1] for i, _ in event.failed_subjobs)
    return _job_field(event, fq)


def _instruction_touches(ins: Instruction, fq: FQID, event: Event, event_touched: bool) -> bool:
    if isinstance(ins, instructions.Reply):  # a request's answer, given with the event that settled its part
        return event_touched
    runs = getattr(ins, "runs", None)
    if isinstance(runs, Runs):
        return _position(runs, fq) is not None
    return _job_field(ins, fq)


def _told(event: Event, step: Step, fq: FQID) -> Iterator[Entry]:
    """The entries of one step that touched ``fq``: its event first, when anything of the step did."""
    touched = _event_touches(event, fq)
    rest: list[Entry] = []
    for change in step.changes:
        if _position(change.runs, fq) is not None:
            rest.append(_entry(change.stimulus_id, change.time, "change", "StatusChanged", _change(change)))
    for refusal in step.refusals:
        if refusal.fqid == fq:
            rest.append(_entry(refusal.stimulus_id, event.time, "refusal", "Refusal", _refusal(refusal)))
    for ins in step.instructions:
        if _instruction_touches(ins, fq, event, touched):
            rest.append(_entry(ins.stimulus_id, event.time, "instruction", type(ins).__name__,
                               _instruction(ins, fq, event)))
    if touched or rest:
        yield _entry(event.stimulus_id, event.time, "event", type(event).__name__,
                     _event(event, fq) if touched else _others(event))
    yield from rest


def _entry(sid: str, time: float, kind: str, name: str, description: str) -> Entry:
    return {"stimulus_id": sid, "time": time, "kind": kind, "type": name, "description": description}


# ------------------------------------------------------------------ descriptions (only when asked)
def _of(runs: Runs) -> str:
    """`` (of 1,000 runs)`` for a batch: the entry was about many runs at once."""
    return f" (one of {len(runs):,} runs)" if len(runs) > 1 else ""


def _change(change: Change) -> str:
    return f"{change.old.value} -> {change.new.value}" + (" (forced)" if change.forced else "") + _of(change.runs)


def _refusal(refusal: Refusal) -> str:
    moved = f" ({refusal.old.value} -> {refusal.new.value})" if refusal.old and refusal.new else ""
    return f"refused{moved}: {refusal.reason}"


def _request(event: events.Request) -> str:
    what = type(event).__name__.removesuffix("Requested").lower()
    extra = {name: getattr(event, name) for name in ("only_failed", "start", "retry_args", "status", "force", "link")
             if getattr(event, name, None) not in (None, ())}
    if "status" in extra:
        extra["status"] = extra["status"].value
    said = ", ".join(f"{k}={v}" for k, v in extra.items())
    many = f" ({len(event.targets):,} targets)" if len(event.targets) > 1 else ""
    return f"{what} requested" + (f" ({said})" if said else "") + ("; keep going" if event.keep_going else "") + many


def _outcome(runs: Runs, fq: FQID, said: Sequence[tuple[str, Sequence[Any]]]) -> str:
    """What an outcome said of ``fq``'s position: the first list that holds it (``(position, reason)`` pairs too)."""
    at = _position(runs, fq)
    for word, positions in said:
        for p in positions:
            if p == at:
                return word
            if isinstance(p, (tuple, list)) and p[0] == at:
                return f"{word}: {p[1]}"
    return "-"


def _report(event: events.StatusReport, fq: FQID) -> str:
    parts = []
    for r in event.reports:
        if _position(r.runs, fq) is None:
            continue
        words = [f"{event.backend} says {r.status.value}"]
        if r.exit_code is not None:
            words.append(f"exit code {r.exit_code}")
        if r.verdict:
            words.append(r.verdict)
        if r.reason:
            words.append(r.reason)
        parts.append(", ".join(words) + _of(r.runs))
    return "; ".join(parts)


_EVENTS: dict[type[Event], Callable[[Any, FQID], str]] = {
    events.SubmitOutcomes: lambda e, fq: "submission " + _outcome(e.runs, fq, [
        ("accepted", e.accepted), ("rejected", e.rejected), ("not attempted", e.not_attempted)])
        + (" (native bulk)" if e.native else " (one by one)") + _of(e.runs),
    events.KillOutcomes: lambda e, fq: "kill " + _outcome(e.runs, fq, [
        ("done", e.killed), ("failed", e.failed), ("not attempted", e.not_attempted)]) + _of(e.runs),
    events.LookupOutcomes: lambda e, fq: "looked up: " + _outcome(e.runs, fq, [
        ("the backend has it", e.found), ("the backend never got it", e.absent)]) + _of(e.runs),
    events.StatusReport: _report,
    events.RunLost: lambda e, fq: f"lost: {e.reason}" + _of(e.runs),
    events.RunsSilent: lambda e, fq: f"silent for {e.time - e.since:.1f} s, so lost: {e.reason}" + _of(e.runs),
    events.RetryDue: lambda e, fq: "retry due" + _of(e.runs),
    events.Prepared: lambda e, fq: f"prepared: {e.n_subjobs:,} subjobs" if e.n_subjobs else "prepared",
    events.PrepareFailed: lambda e, fq: f"preparing failed: {e.error}",
    events.LinkedAdded: lambda e, fq: f"{e.role} {e.job} added for master {e.master}",
    events.PostprocessDone: lambda e, fq: (f"postprocessors failed it: {e.error}" if len(fq) == 1 and e.error
                                    else "postprocessors passed" if len(fq) == 1
                                    else "a checker failed it: " + next(r for i, r in e.failed_subjobs if i == fq[1])),
}


def _others(event: Event) -> str:
    """An event that touched the job only through what it caused (a master's status, moved by its subjobs')."""
    runs = getattr(event, "runs", None)
    if isinstance(runs, Runs):
        return f"about {len(runs):,} run{'s' if len(runs) > 1 else ''} of job {runs.job}"
    if isinstance(event, events.StatusReport):
        n = sum(len(r.runs) for r in event.reports)
        return f"{event.backend} reports on {n:,} run{'s' if n > 1 else ''}"
    return ""


def _event(event: Event, fq: FQID) -> str:
    if isinstance(event, events.Request):
        return _request(event)
    describe = _EVENTS.get(type(event))
    return describe(event, fq) if describe is not None else ""


#: What an instruction without details of its own asks.
_SAID: dict[type[Instruction], str] = {
    instructions.Prepare: "split into subjobs and store them", instructions.Unprepare: "remove what preparing made",
    instructions.RunPostprocess: "run the postprocessors", instructions.SetBackend: "store new backend settings",
    instructions.Forget: "forget the job",
    instructions.Lookup: "look the runs up by key", instructions.Unwatch: "stop watching",
}


def _attempt(ins: Instruction, fq: FQID) -> str:
    """``attempt 2 ``: the attempt of ``fq`` an instruction sends or kills (it carries each run's), when it says."""
    runs, attempts = getattr(ins, "runs", None), getattr(ins, "attempts", ())
    at = _position(runs, fq) if isinstance(runs, Runs) else None
    return f"attempt {attempts[at]} " if at is not None and at < len(attempts) else ""


def _instruction(ins: Instruction, fq: FQID, event: Event) -> str:
    runs = getattr(ins, "runs", None)
    batch = _of(runs) if isinstance(runs, Runs) else ""
    if isinstance(ins, instructions.SendSubmit):
        how = "native bulk" if ins.native else "one by one"
        return f"submit {_attempt(ins, fq)}to {ins.backend} ({how}, start {ins.start})" + batch
    if isinstance(ins, instructions.SendKill):
        return f"kill {_attempt(ins, fq)}at {ins.backend}" + batch
    if isinstance(ins, instructions.ScheduleRetry):
        return f"retry in {max(ins.at - event.time, 0.0):.1f} s" + batch
    if isinstance(ins, instructions.AdjustRun):
        return f"rule {ins.rule} changes {ins.setting or 'the backend settings'}" + batch
    if isinstance(ins, instructions.Reply):
        return f"refused: {ins.error}" if ins.error is not None else f"answered: acted on {ins.acted:,}"
    if isinstance(ins, instructions.CreateLinked):
        return f"add the {ins.role}"
    if type(ins) in _SAID:
        attempt = _attempt(ins, fq).strip()
        return _SAID[type(ins)] + (f" ({attempt})" if attempt else "")
    if isinstance(ins, instructions.Notify):
        return f"notify: {ins.status}"
    backend = getattr(ins, "backend", None)
    return (f"at {backend}" if isinstance(backend, str) else "") + batch


__all__ = ["Entry", "Story"]
