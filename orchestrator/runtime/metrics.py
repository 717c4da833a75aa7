"""Prometheus metrics of one home, with prometheus-client: an observer of the bus, and gauges read on scrape.

What is counted comes from the bus, like any observer sees it: every event
by type, every status change by backend and new status, submissions and
their latency per backend (from a ``SendSubmit`` to the ``SubmitOutcomes``
of the same stimulus), retries and final failures by level and verdict (the
history entry the state machine wrote for a run it just moved to ``failed``:
its ``action`` says whether the run goes again), runs lost, and runs looked up
after a crash by what was found. What is read on each scrape: subjobs by
status and backend (the state machine's counters), the bus's queue depth,
each backend's monitoring ticks and the last tick's duration, and its faults
(driver calls that raised or answered nonsense, status queries that failed:
the actors and monitors count them, since a failed poll is no event), and the
jobs' changes the repository refused (the writer counts them). Label
sets are bounded: backend, status, event type, level, verdict, call; never a
job id.

CPU, useful and wasted (GBS): when a run ends, its attempts' own records
(``orch.usage`` in its output dir, :mod:`orchestrator.core.usage`) are read in
a worker thread and added up by backend, judged by the same computation as
``orchestrator report`` (:func:`~orchestrator.core.usage.tally`). A run that
fails and is retried at once (in the same step) is not counted then: its
attempts are judged together at its end, so an attempt a retry resumed from
counts as useful, as the report says. A run resubmitted after it ended
counts, at its next end, only the attempts made since. An ended attempt
whose record is not written yet (a killed wrapper writes it once its
application has stopped, after the status turned ``killed``) is looked for
again every :data:`LATE_POLL` seconds for :data:`LATE_SECONDS`, and counted
when it comes. The counters start with the service, as every Prometheus
counter does. The ends wait for the reader on a bounded stream
(:data:`ENDED_BUFFER` changes): ends past it, while the reader is that far
behind, are not read but counted as skipped, so a slow disk never makes
memory grow; so are late records past :data:`LATE_MAX` runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.events import Event, LookupOutcomes, RunLost, RunsSilent, SubmitOutcomes
from ..core.ids import FQID
from ..core.instructions import SendSubmit
from ..core.machine import StateMachine
from ..core.statuses import ALL_STATUSES, FINAL, JobStatus
from ..core.step import Step
from ..core.usage import Attempt, tally
from .runs import read_usage

#: Submission latencies, seconds: from a millisecond (sim) to minutes (a busy batch system).
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Changes of runs that ended (each a batch of runs) waiting for their CPU records to be read.
ENDED_BUFFER = 10_000
#: Seconds an ended attempt's record is waited for (the wrapper writes it once its application stopped: a kill's
#: grace, a slow shared filesystem), and between two looks for it; runs waited for at most at once.
LATE_SECONDS = 60.0
LATE_POLL = 0.5
LATE_MAX = 100_000

#: One end to read: (backend, ``again``: the run left its end, the job, its indexes or ``None``, and the attempt
#: each had when it ended).
Ended = tuple[str, bool, int, tuple[int, ...] | None, tuple[int, ...]]


@dataclass(slots=True)
class Late:
    """A run whose ended attempt has no record yet: looked for again until ``deadline``."""

    backend: str
    fq: FQID
    attempt: int
    floor: int
    deadline: float


class Metrics:
    """The metrics of one runtime; ``observe`` is a bus hook, ``render`` the text Prometheus scrapes."""

    def __init__(self, sm: StateMachine, *, queue_depth: Callable[[], int],
                 monitors: Callable[[], Mapping[str, tuple[int, float]]],
                 outputdir: Callable[[FQID], Path] | None = None,
                 faults: Callable[[], Mapping[str, Mapping[str, int]]] = dict,
                 refusals: Callable[[], int] = lambda: 0) -> None:
        self.sm = sm
        self.outputdir = outputdir
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.events = Counter("orchestrator_events", "Events handled by the state machine, by type", ["type"],
                              registry=r)
        self.changes = Counter("orchestrator_status_changes", "Runs that entered a status, by backend",
                               ["backend", "status"], registry=r)
        self.submissions = Counter("orchestrator_submissions", "Runs sent to a backend, by outcome",
                                   ["backend", "outcome"], registry=r)
        self.latency = Histogram("orchestrator_submission_seconds", "From a submission's instruction to the "
                                 "backend's answer", ["backend"], buckets=LATENCY_BUCKETS, registry=r)
        self.retries = Counter("orchestrator_retries", "Automatic retries, by failure level and verdict",
                               ["level", "verdict"], registry=r)
        self.failures = Counter("orchestrator_final_failures", "Runs that ended failed, by level and verdict",
                                ["level", "verdict"], registry=r)
        self.lost = Counter("orchestrator_runs_lost", "Runs counted lost (no word from their backend)",
                            ["backend"], registry=r)
        self.reconciled = Counter("orchestrator_runs_reconciled", "Runs caught mid-submission by a crash, looked "
                                  "up by key at start", ["backend", "found"], registry=r)
        self.cpu = Counter("orchestrator_cpu_seconds", "CPU of ended runs' attempts, from their own records: useful "
                           "(succeeded, or resumed from) or wasted", ["backend", "kind"], registry=r)
        self.skipped = Counter("orchestrator_cpu_records_skipped", "Ended runs whose CPU records were not read: "
                               "the reader was too far behind", ["backend"], registry=r)
        r.register(_Gauges(sm, queue_depth, monitors, faults, refusals))
        self._sent: dict[tuple[str, str], float] = {}
        #: Runs that ended or left an end, waiting for their records to be read.
        self._ended_in, self._ended_out = anyio.create_memory_object_stream[Ended](max_buffer_size=ENDED_BUFFER)
        #: Runs resubmitted after they ended: the newest attempt already counted.
        self._counted: dict[tuple[int, int | None], int] = {}
        #: Ended runs whose last attempt's record was not there yet (the reader's thread only).
        self._late: list[Late] = []

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe(self, event: Event, step: Step) -> None:
        self.events.labels(type(event).__name__).inc()
        if isinstance(event, SubmitOutcomes):
            self._answered(event)
        elif isinstance(event, RunLost):
            self.lost.labels(self._backend(event.runs.job)).inc(len(event.runs))
        elif isinstance(event, RunsSilent) and step.changes:  # the core counted them lost: they failed
            lost = sum(len(c) for c in step.changes if c.new is JobStatus.FAILED and c.indexes is not None
                       or c.new is JobStatus.FAILED and not self.sm.is_master(c.job))
            self.lost.labels(self._backend(event.runs.job)).inc(lost)
        elif isinstance(event, LookupOutcomes):
            backend = self._backend(event.runs.job)
            self.reconciled.labels(backend, "yes").inc(len(event.found))
            self.reconciled.labels(backend, "no").inc(len(event.absent))
        retried = _retried(step)
        for change in step.changes:
            if change.indexes is None and self.sm.is_master(change.job):
                continue  # a master's own (derived) status: no run moved, and its history is no run's
            if self.outputdir is not None and (change.new in FINAL) != (change.old in FINAL):
                self._ended(change.job, change.indexes, change.old in FINAL, retried.get(change.job))
            n = 1 if change.indexes is None else len(change.indexes)
            self.changes.labels(self._backend(change.job), change.new.value).inc(n)
            if change.new == JobStatus.FAILED:  # judged just now: retried, or failed for good
                for level, verdict, action in self._judged(change.job, change.indexes):
                    (self.retries if action == "retry" else self.failures).labels(level, verdict).inc()
        for ins in step.instructions:
            if isinstance(ins, SendSubmit):
                self._sent[(ins.stimulus_id, ins.backend)] = step_time(step, event)

    def _ended(self, job: int, indexes: Sequence[int] | None, again: bool, retried: set[int] | None) -> None:
        """Queue a change into or out of a final status for the reader; runs retried in the same step are left
        out of both (their attempts are judged together at their end)."""
        if retried:
            if indexes is None:
                if -1 in retried:
                    return
            else:
                indexes = [i for i in indexes if i not in retried]
            if not indexes:
                return
        backend = self._backend(job)
        chosen = None if indexes is None else tuple(indexes)
        try:
            attempts = self.sm.attempts(job, chosen)
        except KeyError:
            return
        try:
            self._ended_in.send_nowait((backend, again, job, chosen, attempts))
        except anyio.WouldBlock:
            self.skipped.labels(backend).inc(len(attempts))

    async def serve(self) -> None:
        """Read the records of ended runs off the loop, a batch of changes at a time; look again for late ones."""
        async with self._ended_out:
            while True:
                batch: list[Ended] = []
                try:
                    if self._late:
                        with anyio.move_on_after(LATE_POLL):
                            batch.append(await self._ended_out.receive())
                    else:
                        batch.append(await self._ended_out.receive())
                except anyio.EndOfStream:
                    return
                while True:
                    try:
                        batch.append(self._ended_out.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                await anyio.to_thread.run_sync(self._count, batch)

    def _count(self, batch: list[Ended]) -> None:
        assert self.outputdir is not None
        now = time.monotonic()
        totals: dict[tuple[str, str], float] = {}
        for backend, again, job, indexes, ended in batch:
            runs: list[FQID] = [(job,)] if indexes is None else [(job, i) for i in indexes]
            if runs and not self.outputdir(runs[0]).parent.exists():
                continue  # a backend that keeps no run dirs here (sim): nothing to read for the whole batch
            for fq, attempt in zip(runs, ended, strict=True):
                attempts = self._records(fq)  # none yet: the wrapper may still write it
                if attempts is None and again:
                    continue
                attempts = attempts or []
                key = (fq[0], fq[1] if len(fq) > 1 else None)
                if again:
                    self._counted[key] = max((a.attempt for a in attempts), default=0)
                    continue
                floor = self._counted.pop(key, 0)
                if attempt > floor and all(a.attempt != attempt for a in attempts) and len(self._late) < LATE_MAX:
                    self._late.append(Late(backend, fq, attempt, floor, now + LATE_SECONDS))
                    continue
                self._add(totals, backend, attempts, floor)
        keep = []
        for late in self._late:
            attempts = self._records(late.fq) or []
            if any(a.attempt == late.attempt for a in attempts) or now >= late.deadline:
                self._add(totals, late.backend, attempts, late.floor)
            else:
                keep.append(late)
        self._late = keep
        for (backend, kind), seconds in totals.items():
            if 0 < seconds < math.inf:  # (records are the runs' to write: parse_usage skips what is no time)
                self.cpu.labels(backend, kind).inc(seconds)

    def _records(self, fq: FQID) -> list[Attempt] | None:
        assert self.outputdir is not None
        return read_usage(self.outputdir(fq), len(fq) > 1)

    @staticmethod
    def _add(totals: dict[tuple[str, str], float], backend: str, attempts: list[Attempt], floor: int) -> None:
        counted = tally([a for a in attempts if a.attempt > floor])
        totals[(backend, "useful")] = totals.get((backend, "useful"), 0.0) + counted.useful
        totals[(backend, "wasted")] = totals.get((backend, "wasted"), 0.0) + counted.wasted

    def _answered(self, event: SubmitOutcomes) -> None:
        backend = self._backend(event.runs.job)
        start = self._sent.pop((event.stimulus_id, backend), None)
        if start is not None:
            self.latency.labels(backend).observe(max(0.0, event.time - start))
        self.submissions.labels(backend, "accepted").inc(len(event.accepted))
        self.submissions.labels(backend, "rejected").inc(len(event.rejected))
        if len(self._sent) > 10_000:  # answers that never came (a crash mid-call): forget the oldest
            for key in list(self._sent)[:5_000]:
                del self._sent[key]

    def _backend(self, job: int) -> str:
        try:
            return self.sm.profile(job).backend
        except KeyError:
            return "unknown"

    def _judged(self, job: int, indexes: Iterable[int] | None) -> list[tuple[str, str, str]]:
        """``(level, verdict, action)`` of the newest history entry of each run (what the state machine just
        judged: ``action`` is ``retry`` when the run goes again at once)."""
        try:
            entries = self.sm.newest_history(job, indexes)
        except KeyError:
            return []
        return [(str(entry.get("level", "unknown")), str(entry.get("verdict", "unknown")),
                 str(entry.get("action", "failed"))) for entry in entries]


def _retried(step: Step) -> dict[int, set[int]]:
    """Runs the step moved into a final status and out of it again (failed, then retried at once), by job (-1: a
    job without subjobs)."""
    leaving = [c for c in step.changes if c.old in FINAL and c.new not in FINAL]
    if not leaving:
        return {}
    ending: dict[int, set[int]] = {}
    for c in step.changes:
        if c.new in FINAL and c.old not in FINAL:
            ending.setdefault(c.job, set()).update(c.indexes if c.indexes is not None else (-1,))
    out: dict[int, set[int]] = {}
    for c in leaving:
        both = ending.get(c.job, set()).intersection(c.indexes if c.indexes is not None else (-1,))
        if both:
            out.setdefault(c.job, set()).update(both)
    return out


def step_time(step: Step, event: Event) -> float:
    return step.changes[0].time if step.changes else event.time


class _Gauges(Collector):
    """What is read at each scrape rather than counted: it costs one pass over the jobs, not over subjobs."""

    def __init__(self, sm: StateMachine, queue_depth: Callable[[], int],
                 monitors: Callable[[], Mapping[str, tuple[int, float]]],
                 faults: Callable[[], Mapping[str, Mapping[str, int]]], refusals: Callable[[], int]) -> None:
        self.sm, self.queue_depth, self.monitors, self.faults = sm, queue_depth, monitors, faults
        self.refusals = refusals

    def collect(self) -> Iterable[Any]:
        runs = GaugeMetricFamily("orchestrator_runs", "Runs (subjobs, and jobs without subjobs) by status and "
                                 "backend", labels=["backend", "status"])
        totals: dict[tuple[str, str], int] = {}
        for job in self.sm.job_ids():
            backend = self.sm.profile(job).backend
            for status, n in self.sm.counts(job).items() if self.sm.is_master(job) else [(self.sm.status((job,)), 1)]:
                key = (backend, status.value)
                totals[key] = totals.get(key, 0) + n
        for (backend, name), n in sorted(totals.items()):
            runs.add_metric([backend, name], n)
        yield runs
        jobs = GaugeMetricFamily("orchestrator_jobs", "Top-level jobs by status", labels=["status"])
        by_status = {s.value: 0 for s in ALL_STATUSES}
        for job in self.sm.job_ids():
            by_status[self.sm.status((job,)).value] += 1
        for name, n in by_status.items():
            jobs.add_metric([name], n)
        yield jobs
        yield GaugeMetricFamily("orchestrator_bus_queue_depth", "Events waiting on the bus", value=self.queue_depth())
        ticks = GaugeMetricFamily("orchestrator_monitor_ticks", "Monitoring ticks so far, by backend",
                                  labels=["backend"])
        last = GaugeMetricFamily("orchestrator_monitor_tick_seconds", "Duration of the last monitoring tick",
                                 labels=["backend"])
        for backend, (n, seconds) in sorted(self.monitors().items()):
            ticks.add_metric([backend], n)
            last.add_metric([backend], seconds)
        yield ticks
        yield last
        faults = CounterMetricFamily("orchestrator_backend_faults", "Failed driver calls and status queries "
                                     "(raised, or answered nonsense), by backend and call", labels=["backend", "call"])
        for backend, calls in sorted(self.faults().items()):
            for call, n in sorted(calls.items()):
                faults.add_metric([backend, call], n)
        yield faults
        yield CounterMetricFamily("orchestrator_repository_refusals", "Jobs' changes the repository refused, left "
                                  "out of a flush that wrote the other jobs' (the log names each job)",
                                  value=self.refusals())
