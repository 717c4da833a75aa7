"""The state every handler shares, and the primitive moves they make.

Nothing here decides: a handler (``requests``, ``outcomes``, ``monitoring``,
``partition``) decides what should happen and calls these to make it so.
``move`` is the one place a run's status changes; it checks the transition
table, keeps the per-status counters, the attempt counter and the entry
times, marks what must be written, and records the change in the step under
construction. ``rederive`` recomputes a master's status from its counters.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from .errors import JobError
from .events import Event, Request
from .ids import FQID, Runs
from .instructions import Instruction, Reply
from .jobs import JobState
from .statuses import FINAL, JobStatus, allowed, attempt_change
from .step import Change, Refusal, Step
from .table import REFUSED_KEPT, SPARSE_TIMED, TIMED

_TIMED_CODES = {JobStatus(k).code: k for k in TIMED}
_FINAL_CODES = frozenset(s.code for s in FINAL)
_SPARSE_CODES = {s.code: s.value for s in SPARSE_TIMED}
#: Batches this large are tried whole (:meth:`Core._move_uniform`) before run by run.
_BULK = 256


@dataclass(slots=True)
class Pending:
    """A request under way: its targets, grouped by top-level job, and what came of them so far."""

    event: Request
    kind: str
    #: Groups not begun yet: (top-level job, the targets in it), in the order given.
    todo: deque[tuple[int, list[FQID]]]
    #: Top-level jobs whose part is under way -> instructions still to be answered.
    running: dict[int, int] = field(default_factory=dict)
    #: What went wrong, in order; ``True`` marks an error raised whatever keep_going says (a rolled-back
    #: submission, a failed split, a refused submit or release), ``False`` one that keep_going forgives.
    errors: list[tuple[JobError, bool]] = field(default_factory=list)
    acted: int = 0

    @property
    def sid(self) -> str:
        return self.event.stimulus_id

    @property
    def keep_going(self) -> bool:
        return self.event.keep_going


@dataclass(slots=True)
class Sending:
    """A ``SendSubmit`` under way: what its rejected runs become, and which request awaits it."""

    kind: str  # "submit", "resubmit", "retry", "release", "resend"
    request: str | None
    #: Runs that were ``new`` before a resubmission: rejected, they stay ``new``.
    was_new: frozenset[int] = frozenset()
    #: (fqid, why) of the runs rejected by the parts answered so far (a submission answered in parts).
    failures: list[tuple[str, str]] = field(default_factory=list)


@dataclass(slots=True)
class Killing:
    """A ``SendKill`` under way: what its killed runs become (``None``: nothing, e.g. a lost run's kill)."""

    request: str | None
    to: JobStatus | None = JobStatus.KILLED
    forced: bool = False


#: (stimulus id, job, first run of the batch): one event may send several batches of one job (two runs of it
#: retried from one status report), and each outcome must find its own record.
SendKey = tuple[str, int, int]


def send_key(sid: str, runs: Runs) -> SendKey:
    """The key of the instruction for ``runs`` sent under ``sid`` (its outcome names the same runs)."""
    return sid, runs.job, -1 if runs.indexes is None else (runs.indexes[0] if len(runs.indexes) else -2)


class Core:
    """Shared state; see the module docstring."""

    def __init__(self, order: str = "submitted-first", lost_after: float = 600.0) -> None:
        self.order = order
        #: ``lost_after_seconds``: a run monitoring heard nothing intelligible of for this long is lost.
        self.lost_after = lost_after
        self.jobs: dict[int, JobState] = {}
        self.pending: dict[str, Pending] = {}
        #: Top-level job -> the request that holds it: two operations on one job never interleave.
        self.busy: dict[int, str] = {}
        #: Requests that found a job busy, handled again once it is free, in arrival order.
        self.waiting: deque[tuple[Request, str]] = deque()
        #: Instructions to drivers awaiting their outcome, by :func:`send_key`.
        self.sending: dict[SendKey, Sending] = {}
        self.killing: dict[SendKey, Killing] = {}
        #: Runs a kill was asked for while they were being submitted (a retry): killed once they are out.
        self.kill_after: dict[int, set[int]] = {}
        #: Runs whose stored form is out of date: job -> indexes (``None``: every run of it).
        self.dirty: dict[int, set[int] | None] = {}
        #: Top-level jobs whose own row is out of date.
        self.dirty_tops: set[int] = set()
        #: The step under construction and the time of the event being handled.
        self.step = Step("")
        self.now = 0.0

    def occupied(self, job: int) -> bool:
        """A request holds the job, or a submission of it (a retry, a resend) awaits its outcome: another
        request on it waits."""
        return job in self.busy or any(key[1] == job for key in self.sending)

    # ------------------------------------------------------------ the step
    def begin(self, event: Event) -> None:
        self.step = Step(event.stimulus_id)
        self.now = event.time

    def emit(self, instruction: Instruction) -> None:
        self.step.instructions.append(instruction)

    def refuse(self, fqid: FQID, reason: str, sid: str, old: JobStatus | None = None,
               new: JobStatus | None = None) -> None:
        self.step.refusals.append(Refusal(fqid, reason, sid, old, new))

    def reply(self, sid: str, error: JobError | None = None, acted: int = 0) -> None:
        self.emit(Reply(stimulus_id=sid, error=error, acted=acted))

    # ------------------------------------------------------------ dirt
    def mark(self, job: int, indexes: Iterable[int] | None = None) -> None:
        """Runs of ``job`` (``None``: all of them) must be written again; its own row too."""
        self.dirty_tops.add(job)
        if indexes is None:
            self.dirty[job] = None
            return
        current = self.dirty.setdefault(job, set())
        if current is not None:
            current.update(indexes)

    def take_dirty(self) -> tuple[dict[int, set[int] | None], set[int]]:
        """What changed since the last call (the runtime's writer takes it at each flush)."""
        dirty, tops = self.dirty, self.dirty_tops
        self.dirty, self.dirty_tops = {}, set()
        return dirty, tops

    # ------------------------------------------------------------ moves
    def move(self, js: JobState, indexes: Sequence[int], new: JobStatus, sid: str, *,
             forced: bool = False, report: bool = False) -> Sequence[int]:
        """Move runs ``indexes`` of ``js`` to ``new`` where the table allows; return those moved.

        ``forced``: a user's ``force_status``, outside the table. ``report``:
        the move was a backend's word, so a refused one is kept in the run's
        ``refused`` record. A master's status is re-derived by the caller.
        """
        runs = js.runs
        if not forced and len(indexes) >= _BULK:
            whole = self._move_uniform(js, indexes, new, sid)
            if whole is not None:
                return whole
        status, attempt, counts = runs.status, runs.attempt, runs.counts
        code_new = new.code
        groups: dict[int, list[int]] = {}
        now = self.now
        timed = runs.times.get(_TIMED_CODES.get(code_new, ""))
        sparse = _SPARSE_CODES.get(code_new)
        final = code_new in _FINAL_CODES
        for i in indexes:
            code_old = status[i]
            if code_old == code_new and not forced:
                continue
            old = JobStatus.from_code(code_old)
            if not forced and not allowed(old, new):
                self._refused(js, i, old, new, sid, report)
                continue
            status[i] = code_new
            counts[code_old] -= 1
            counts[code_new] += 1
            if delta := attempt_change(old, new):
                attempt[i] = max(attempt[i] + delta, 0)
            if timed is not None:
                timed[i] = now
            if sparse is not None:
                runs.extra(i).timestamps[sparse] = now
            if final:
                runs.times["final"][i] = now
            groups.setdefault(code_old, []).append(i)
        moved: list[int] = []
        for code_old, idxs in groups.items():
            old = JobStatus.from_code(code_old)
            self.step.changes.append(Change(js.id, idxs if js.is_master else None, old, new, now, sid, forced))
            moved += idxs
            if js.is_master:
                js.note_master_times(new, now)
        if moved:
            self.mark(js.id, moved if len(moved) < len(runs) else None)
        return moved

    def _move_uniform(self, js: JobState, indexes: Sequence[int], new: JobStatus, sid: str) -> Sequence[int] | None:
        """:meth:`move` for a large batch whose runs are all in one status the table lets go to ``new`` (a
        chunk submitted, started or ended together): whole slices at once. ``None``: not such a batch."""
        runs = js.runs
        status = runs.status
        contiguous = isinstance(indexes, range) and indexes.step == 1
        if contiguous:
            assert isinstance(indexes, range)
            lo, hi = indexes.start, indexes.stop
            code_old = status[lo]
            if status.count(code_old, lo, hi) != hi - lo:
                return None
        else:
            codes = itemgetter(*indexes)(status)
            code_old = codes[0]
            if codes.count(code_old) != len(codes) or len(set(indexes)) != len(codes):
                return None  # mixed statuses, or a run named twice
        old = JobStatus.from_code(code_old)
        if code_old == new.code:
            return []
        if not allowed(old, new):
            return None  # refused run by run, each on record
        n = len(indexes)
        now = self.now
        timed = runs.times.get(_TIMED_CODES.get(new.code, ""))
        stamps = [t for t in (timed, runs.times["final"] if new.code in _FINAL_CODES else None) if t is not None]
        if contiguous:
            status[lo:hi] = bytes([new.code]) * n
            for times in stamps:
                times[lo:hi] = array("d", [now]) * n
        else:
            for i in indexes:
                status[i] = new.code
            for times in stamps:
                for i in indexes:
                    times[i] = now
        if delta := attempt_change(old, new):
            attempt = runs.attempt
            for i in indexes:
                attempt[i] = max(attempt[i] + delta, 0)
        sparse = _SPARSE_CODES.get(new.code)
        if sparse is not None:
            for i in indexes:
                runs.extra(i).timestamps[sparse] = now
        runs.counts[code_old] -= n
        runs.counts[new.code] += n
        self.step.changes.append(Change(js.id, indexes if js.is_master else None, old, new, now, sid))
        if js.is_master:
            js.note_master_times(new, now)
        self.mark(js.id, indexes if n < len(runs) else None)
        return indexes

    def set_run_times(self, js: JobState, indexes: Sequence[int], *, started: float | None,
                      ended: float | None) -> None:
        """The times a run's log gives (its wrapper's start and end lines, as the driver reported them) replace
        the times its moves were seen: ``running`` from ``started``; its final (or held) time from ``ended``
        when it is final (or held) now. A master's start times follow; its end times are set once it is final."""
        if not indexes or (started is None and ended is None):
            return
        runs = js.runs
        running = runs.times["running"]
        finals = runs.times["final"]
        for i in indexes:
            if started is not None:
                running[i] = started
            code = runs.status[i]
            if ended is not None and (code in _FINAL_CODES or code == JobStatus.HELD.code):
                if code in _FINAL_CODES:
                    finals[i] = ended
                sparse = _SPARSE_CODES.get(code)
                if sparse is not None:
                    runs.extra(i).timestamps[sparse] = ended
        if js.is_master and started is not None:
            js.note_master_times(JobStatus.RUNNING, started)
        self.mark(js.id, indexes if js.is_master else None)

    def _refused(self, js: JobState, i: int, old: JobStatus, new: JobStatus, sid: str, report: bool) -> None:
        fq = (js.id, i) if js.is_master else (js.id,)
        reason = f"illegal transition {old.value} -> {new.value}"
        self.refuse(fq, reason, sid, old, new)
        if report:
            extra = js.runs.extra(i)
            extra.refused = [*extra.refused, f"{old.value}->{new.value}: {reason}"][-REFUSED_KEPT:]
            self.mark(js.id, [i])

    def rederive(self, js: JobState, sid: str) -> bool:
        """Recompute a master's status; record a change of what it shows. True if it just ended (all final)."""
        if not js.is_master:
            return False
        shown_before = js.status
        js.derived = js.derive()
        shown = js.status
        if shown != shown_before:
            self.step.changes.append(Change(js.id, None, shown_before, shown, self.now, sid))
            self.dirty_tops.add(js.id)
            js.note_master_end()
            return js.pinned is None and js.all_final()
        return False

    def pin(self, js: JobState, status: JobStatus | None, sid: str) -> bool:
        """Show ``status`` on a master while something stands in for its subjobs; ``None`` derives again.

        Returns True when unpinning shows a master whose subjobs all ended.
        """
        before = js.status
        js.pinned = status
        if status is None:
            js.derived = js.derive()
        if status == JobStatus.SUBMITTING:
            js.top.timestamps["submitting"] = self.now
        after = js.status
        self.dirty_tops.add(js.id)
        if js.is_master:
            js.note_master_end()
        if after != before:
            self.step.changes.append(Change(js.id, None, before, after, self.now, sid))
            return status is None and js.all_final()
        return False

    # ------------------------------------------------------------ look-ups
    def job_of(self, fq: FQID) -> JobState | None:
        js = self.jobs.get(fq[0])
        if js is None or len(fq) > 2 or any(p < 0 for p in fq):
            return None
        if len(fq) == 2 and (not js.is_master or fq[1] >= len(js.runs)):
            return None
        return js

    def status_of(self, fq: FQID) -> JobStatus:
        js = self.jobs[fq[0]]
        return js.runs.get(fq[1]) if len(fq) == 2 else js.status

    def runs_of(self, js: JobState, indexes: Sequence[int]) -> Runs:
        return Runs(js.id, indexes) if js.is_master else Runs(js.id)


def positions(js: JobState, runs: Runs) -> Sequence[int]:
    """The table indexes a batch names (a job that runs itself is index 0)."""
    return runs.indexes if runs.indexes is not None and js.is_master else [0]


__all__ = ["Core", "Killing", "Pending", "Sending", "positions"]
