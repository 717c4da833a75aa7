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
the actors and monitors count them, since a failed poll is no event). Label
sets are bounded: backend, status, event type, level, verdict, call; never a
job id.

CPU, useful and wasted (GBS): when a run ends, its attempts' own records
(``orch.usage`` in its output dir, :mod:`orchestrator.core.usage`) are read in
a worker thread and added up by backend. A run resubmitted after it ended
counts, at its next end, only the attempts made since. The counters start
with the service, as every Prometheus counter does. The ends wait for the
reader on a bounded stream (:data:`ENDED_BUFFER` changes): ends past it,
while the reader is that far behind, are not read but counted as skipped,
so a slow disk never makes memory grow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import anyio
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.events import Event, LookupOutcomes, RunLost, SubmitOutcomes
from ..core.ids import FQID
from ..core.instructions import SendSubmit
from ..core.machine import StateMachine
from ..core.statuses import ALL_STATUSES, FINAL, JobStatus
from ..core.step import Step
from ..core.usage import USAGE_FILE, judge, parse_usage
from ..plugin.users import read_inside

#: Submission latencies, seconds: from a millisecond (sim) to minutes (a busy batch system).
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
#: Changes of runs that ended (each a batch of runs) waiting for their CPU records to be read.
ENDED_BUFFER = 10_000


class Metrics:
    """The metrics of one runtime; ``observe`` is a bus hook, ``render`` the text Prometheus scrapes."""

    def __init__(self, sm: StateMachine, *, queue_depth: Callable[[], int],
                 monitors: Callable[[], Mapping[str, tuple[int, float]]],
                 outputdir: Callable[[FQID], Path] | None = None,
                 faults: Callable[[], Mapping[str, Mapping[str, int]]] = dict) -> None:
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
        r.register(_Gauges(sm, queue_depth, monitors, faults))
        self._sent: dict[tuple[str, str], float] = {}
        #: Runs that ended or left an end, waiting for their records to be read: (backend, again, job, indexes).
        self._ended_in, self._ended_out = anyio.create_memory_object_stream[
            tuple[str, bool, int, tuple[int, ...] | None]](max_buffer_size=ENDED_BUFFER)
        #: Runs resubmitted after they ended: the newest attempt already counted.
        self._counted: dict[tuple[int, int | None], int] = {}

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe(self, event: Event, step: Step) -> None:
        self.events.labels(type(event).__name__).inc()
        if isinstance(event, SubmitOutcomes):
            self._answered(event)
        elif isinstance(event, RunLost):
            self.lost.labels(self._backend(event.runs.job)).inc(len(event.runs))
        elif isinstance(event, LookupOutcomes):
            backend = self._backend(event.runs.job)
            self.reconciled.labels(backend, "yes").inc(len(event.found))
            self.reconciled.labels(backend, "no").inc(len(event.absent))
        for change in step.changes:
            if change.indexes is None and self._is_master(change.job):
                continue  # a master's own (derived) status: no run moved, and its history is no run's
            if self.outputdir is not None and (change.new in FINAL) != (change.old in FINAL):
                indexes = None if change.indexes is None else tuple(change.indexes)
                backend = self._backend(change.job)
                try:
                    self._ended_in.send_nowait((backend, change.old in FINAL, change.job, indexes))
                except anyio.WouldBlock:
                    self.skipped.labels(backend).inc(1 if indexes is None else len(indexes))
            n = 1 if change.indexes is None else len(change.indexes)
            self.changes.labels(self._backend(change.job), change.new.value).inc(n)
            if change.new == JobStatus.FAILED:  # judged just now: retried, or failed for good
                for level, verdict, action in self._judged(change.job, change.indexes):
                    (self.retries if action == "retry" else self.failures).labels(level, verdict).inc()
        for ins in step.instructions:
            if isinstance(ins, SendSubmit):
                self._sent[(ins.stimulus_id, ins.backend)] = step_time(step, event)

    async def serve(self) -> None:
        """Read the records of ended runs off the loop, a batch of changes at a time."""
        async with self._ended_out:
            async for first in self._ended_out:
                batch = [first]
                while True:
                    try:
                        batch.append(self._ended_out.receive_nowait())
                    except anyio.WouldBlock:
                        break
                await anyio.to_thread.run_sync(self._count, batch)

    def _count(self, batch: list[tuple[str, bool, int, tuple[int, ...] | None]]) -> None:
        assert self.outputdir is not None
        for backend, again, job, indexes in batch:
            runs: list[FQID] = [(job,)] if indexes is None else [(job, i) for i in indexes]
            if runs and not self.outputdir(runs[0]).parent.exists():
                continue  # a backend that keeps no run dirs here (sim): nothing to read for the whole batch
            useful = wasted = 0.0
            for fq in runs:
                try:
                    out = self.outputdir(fq)
                    top = out.parent.parent if len(fq) > 1 else out.parent  # the top-level job's dir
                    attempts = parse_usage(read_inside(out / USAGE_FILE, top).decode(errors="replace"))
                except OSError:
                    continue
                key = (fq[0], fq[1] if len(fq) > 1 else None)
                if again:
                    self._counted[key] = max((a.attempt for a in attempts), default=0)
                    continue
                floor = self._counted.pop(key, 0)
                for attempt, cause in judge([a for a in attempts if a.attempt > floor], ()):
                    if cause is None:
                        useful += attempt.cpu
                    else:
                        wasted += attempt.cpu
            if useful:
                self.cpu.labels(backend, "useful").inc(useful)
            if wasted:
                self.cpu.labels(backend, "wasted").inc(wasted)

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
            return self.sm.job_state(job).profile.backend
        except KeyError:
            return "unknown"

    def _is_master(self, job: int) -> bool:
        try:
            return self.sm.job_state(job).is_master
        except KeyError:
            return False

    def _judged(self, job: int, indexes: Iterable[int] | None) -> list[tuple[str, str, str]]:
        """``(level, verdict, action)`` of the newest history entry of each run (what the state machine just
        judged: ``action`` is ``retry`` when the run goes again at once)."""
        try:
            runs = self.sm.job_state(job).runs
        except KeyError:
            return []
        out = []
        for i in indexes if indexes is not None else [0]:
            extra = runs.extras.get(i)
            if extra is not None and extra.history:
                entry = extra.history[-1]
                out.append((str(entry.get("level", "unknown")), str(entry.get("verdict", "unknown")),
                            str(entry.get("action", "failed"))))
        return out


def step_time(step: Step, event: Event) -> float:
    return step.changes[0].time if step.changes else event.time


class _Gauges(Collector):
    """What is read at each scrape rather than counted: it costs one pass over the jobs, not over subjobs."""

    def __init__(self, sm: StateMachine, queue_depth: Callable[[], int],
                 monitors: Callable[[], Mapping[str, tuple[int, float]]],
                 faults: Callable[[], Mapping[str, Mapping[str, int]]]) -> None:
        self.sm, self.queue_depth, self.monitors, self.faults = sm, queue_depth, monitors, faults

    def collect(self) -> Iterable[Any]:
        runs = GaugeMetricFamily("orchestrator_runs", "Runs (subjobs, and jobs without subjobs) by status and "
                                 "backend", labels=["backend", "status"])
        totals: dict[tuple[str, str], int] = {}
        for job in self.sm.job_ids():
            js = self.sm.job_state(job)
            for status, n in js.counts().items() if js.is_master else [(js.status, 1)]:
                key = (js.profile.backend, status.value)
                totals[key] = totals.get(key, 0) + n
        for (backend, name), n in sorted(totals.items()):
            runs.add_metric([backend, name], n)
        yield runs
        jobs = GaugeMetricFamily("orchestrator_jobs", "Top-level jobs by status", labels=["status"])
        by_status = {s.value: 0 for s in ALL_STATUSES}
        for job in self.sm.job_ids():
            by_status[self.sm.job_state(job).status.value] += 1
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
