"""``sim``: a simulated backend that runs no process.

For tests and plugin authors. Its behaviour is set per subjob index:

    Backend("sim", bulk=False, fail_submit=[1], run_seconds=0.1, outcome={2: "failed"})

``fail_submit`` lists indexes whose every submission fails, or maps an index
to how many of its first submissions fail (counted in the driver's state
dir, so across restarts); ``outcome`` maps an index to a final status, or to
a list of them, one per attempt; ``queued`` maps an index to the seconds it
waits, submitted, before it runs. ``bulk`` picks native (default) or
emulated bulk. A run's whole fate is written into its backend id when it is
submitted, so it survives a restart of the orchestrator.

By default it is a reporting driver: a timer heap says when runs start and
end, and it reports them then, so a thousand idle runs cost nothing. With
``polled=True`` it is polled instead (``status_bulk``), like a batch system.

Faults, for tests of what the core does when a backend misbehaves, are
switched on and off while runs go on by writing ``faults.json`` in the
driver's state dir (``<home>/backends/sim/faults.json``)::

    {"status": "raise"}      polled status queries raise (the backend is down)
    {"status": "garbage"}    they answer nonsense (unknown runs, bad statuses)
    {"status": "alternate"}  one raises, the next babbles, and so on
    {"submit": "raise"}      submissions fail as a whole (the call raises)
    {"crash_after": 2}       the orchestrator's process dies (SIGKILL) in the middle of a
                             submission call, once the backend took 2 runs of it

and removed (or emptied) to end them. Every accepted run is
appended to a ledger, ``submissions.log`` in the state dir (one write per
call), the way a real backend keeps its queue: ``lookup`` finds runs there
by key, and tests read it to prove that nothing was submitted twice.
Written against the plugin SDK only.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import os
import signal
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from orchestrator.plugin import (
    Capabilities,
    Driver,
    DriverContext,
    JobStatus,
    RunHandle,
    RunSpec,
    Settings,
    SettingsError,
    StatusUpdate,
    SubmitError,
    SubmitOutcome,
)

FINALS = ("completed", "failed", "killed", "held")
#: Runs that start or end together: their fqids, backend ids and final statuses, as three lists.
_Batch = tuple[list[str], list[str], list[str]]


#: A final status's report: (status, exit code, reason).
_ENDING = {f: (JobStatus(f), 0 if f == "completed" else 1, None if f == "completed" else f"sim: outcome {f}")
           for f in FINALS}


class _Schedule:
    """Runs to start and end, by time: the batches a submission (or a restart) adds to the heap."""

    def __init__(self) -> None:
        self.starts: dict[float, _Batch] = {}
        self.ends: dict[float, _Batch] = {}
        self.ids: list[str] = []

    def add(self, fqid: str, backend_id: str, start: float, end: float, final: str) -> None:
        self.ids.append(backend_id)
        for at, batches in ((start, self.starts), (end, self.ends)):
            batch = batches.get(at)
            if batch is None:
                batch = batches[at] = ([], [], [])
            batch[0].append(fqid)
            batch[1].append(backend_id)
            batch[2].append(final)


@functools.lru_cache(maxsize=64)
def _when(start: float, run_seconds: float) -> tuple[float, float, str]:
    """A run's start and end as its id writes them (to the microsecond), and that part of the id: the same for
    every run of a call, so made once."""
    text = f"{start:.6f}:{start + run_seconds:.6f}"
    begin, _, end = text.partition(":")
    return float(begin), float(end), text


def _fate(backend_id: str) -> tuple[float, float, str]:
    """When a run starts and ends, and how: all written in its backend id."""
    try:
        _, _, _, start, end, final = backend_id.rsplit(":", 5)
        return float(start), float(end), final if final in FINALS else "failed"
    except ValueError:
        return 0.0, 0.0, "failed"


def _index_map(value: Any, name: str, check: Any) -> dict[int, Any]:
    items: Iterable[tuple[Any, Any]]
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = ((k, None) for k in value)
    else:
        raise SettingsError(name, f"{name} must be a list of indexes or a mapping, not {value!r}")
    out: dict[int, Any] = {}
    for key, v in items:
        try:
            index = int(key)
        except (TypeError, ValueError):
            raise SettingsError(name, f"{name}: {key!r} is not a subjob index") from None
        out[index] = check(v)
    return out


def _outcome(v: Any) -> list[str]:
    values = [v] if isinstance(v, str) else list(v)
    for s in values:
        if s not in FINALS:
            raise SettingsError("outcome", f"outcome {s!r} is not one of {sorted(FINALS)}")
    return values


def _times(v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise SettingsError("fail_submit", f"fail_submit counts must be integers >= 0, not {v!r}")
    return v


def _seconds(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise SettingsError("queued", f"queued times must be numbers of seconds >= 0, not {v!r}")
    return float(v)


@dataclass(frozen=True)
class SimSettings(Settings):
    bulk: bool = True
    polled: bool = False
    run_seconds: float = 0.1
    fail_submit: Any = field(default_factory=list)
    outcome: Any = field(default_factory=dict)
    queued: Any = field(default_factory=dict)

    def check(self) -> None:
        if self.run_seconds < 0:
            raise SettingsError("run_seconds", f"run_seconds must be a number >= 0, not {self.run_seconds!r}")
        _index_map(self.fail_submit, "fail_submit", _times)
        _index_map(self.outcome, "outcome", _outcome)
        _index_map(self.queued, "queued", _seconds)


class SimDriver(Driver):
    name = "sim"
    settings = SimSettings
    capabilities = Capabilities(bulk_submit=True, bulk_kill=True, lookup=True, reports=True)
    _MODES = {(bulk, polled): Capabilities(bulk_submit=bulk, bulk_kill=bulk, bulk_status=True, lookup=True,
                                           reports=not polled)
              for bulk in (True, False) for polled in (True, False)}

    def __init__(self, context: DriverContext) -> None:
        super().__init__(context)
        self.ledger = context.statedir / "submissions.log"
        self.counts = context.statedir / "submit-counts.log"
        #: Submissions per subjob that has ``fail_submit``, read from ``counts`` when first needed.
        self._submits: dict[str, int] | None = None
        #: (time, sequence, "start" or "end", the runs: their fqids, backend ids and final statuses)
        self._heap: list[tuple[float, int, str, _Batch]] = []
        self._seq = itertools.count()
        self._gone: set[str] = set()
        self._wake = anyio.Event()
        self.calls: dict[str, int] = {"submit": 0, "submit_bulk": 0, "kill": 0, "kill_bulk": 0, "status_bulk": 0}
        self.faults_file = context.statedir / "faults.json"
        self._alternate = 0

    @classmethod
    def validate_settings(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        out = super().validate_settings(settings)
        if "fail_submit" in out:  # JSON keys: the settings are stored
            out["fail_submit"] = {str(k): v for k, v in _index_map(out["fail_submit"], "fail_submit",
                                                                   _times).items()}
        if "outcome" in out:
            out["outcome"] = {str(k): v for k, v in _index_map(out["outcome"], "outcome", _outcome).items()}
        if "queued" in out:
            out["queued"] = {str(k): v for k, v in _index_map(out["queued"], "queued", _seconds).items()}
        return out

    def capabilities_for(self, settings: Mapping[str, Any]) -> Capabilities:
        return self._MODES[(bool(settings.get("bulk", True)), bool(settings.get("polled", False)))]

    def metrics(self) -> dict[str, Any]:
        return {"calls": dict(self.calls)}

    def _fault(self, kind: str) -> str | None:
        try:
            faults = json.loads(self.faults_file.read_text(encoding="utf-8") or "{}")
        except (FileNotFoundError, ValueError):
            return None
        value = faults.get(kind) if isinstance(faults, dict) else None
        return value if isinstance(value, str) else None

    # ------------------------------------------------------------ the ledger
    def _read_counts(self) -> dict[str, int]:
        """Submissions per subjob so far (``fail_submit={i: n}`` counts them across restarts)."""
        out: dict[str, int] = {}
        try:
            for line in self.counts.read_text(encoding="utf-8").splitlines():
                out[line] = out.get(line, 0) + 1
        except FileNotFoundError:
            pass
        return out

    def _record(self, accepted: Sequence[tuple[str, str]]) -> None:
        """Append ``key backend_id`` lines, written before the ids are returned."""
        if accepted:
            with open(self.ledger, "a", encoding="utf-8") as f:
                f.write("".join(f"{key} {backend_id}\n" for key, backend_id in accepted))

    def submissions(self) -> dict[str, list[str]]:
        """The ledger: backend ids accepted under each key, in order."""
        out: dict[str, list[str]] = {}
        try:
            text = self.ledger.read_text(encoding="utf-8")
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            key, _, backend_id = line.partition(" ")
            if backend_id:
                out.setdefault(key, []).append(backend_id)
        return out

    async def lookup(self, runs: Sequence[RunSpec]) -> list[str | None]:
        got = self.submissions()
        await anyio.lowlevel.checkpoint()
        return [got[r.key][-1] if r.key in got else None for r in runs]

    # ------------------------------------------------------------ submission
    def _plan(self, settings: Mapping[str, Any]) -> tuple[dict[int, Any], dict[int, Any], dict[int, Any], float]:
        """A settings' per-index maps, parsed (once per settings object of a call, not once per run)."""
        return (_index_map(settings.get("fail_submit", {}), "fail_submit", _times),
                _index_map(settings.get("outcome", {}), "outcome", _outcome),
                _index_map(settings.get("queued", {}), "queued", _seconds), float(settings.get("run_seconds", 0.1)))

    def _start(self, run: RunSpec, counted: list[str], now: float,
               plan: tuple[dict[int, Any], dict[int, Any], dict[int, Any], float] | None = None
               ) -> tuple[str, float, float, str]:
        """Decide the run's fate now: its backend id, start, end and final status; raise SubmitError for a
        failing submission."""
        fail, outcome, queue, run_seconds = plan or self._plan(run.settings)
        if run.index in fail:  # only these are counted: a million other runs cost no line and no memory
            if self._submits is None:
                self._submits = self._read_counts()
            n = self._submits[run.fqid] = self._submits.get(run.fqid, 0) + 1
            counted.append(run.fqid)
            limit = fail[run.index]
            if limit is None or n <= limit:
                raise SubmitError(f"sim: submission {n} of subjob {run.index} refused (fail_submit)")
        outcomes = outcome.get(run.index)
        final = "completed" if outcomes is None else outcomes[min(run.attempt - 1, len(outcomes) - 1)]
        times = _when(now + queue.get(run.index, 0.0), run_seconds)  # a batch runs together
        return f"sim:{run.fqid}:{run.attempt}:{times[2]}:{final}", times[0], times[1], final

    async def submit_bulk(self, runs: Sequence[RunSpec]) -> list[SubmitOutcome]:
        self.calls["submit_bulk"] += 1
        if self._fault("submit") == "raise":
            raise ConnectionError("sim: backend unreachable (faults.json)")
        outcomes: list[SubmitOutcome] = []
        counted: list[str] = []
        now = time.time()
        crash = self._crash_after()
        plans: dict[int, tuple[dict[int, Any], dict[int, Any], dict[int, Any], float]] = {}
        schedule = _Schedule()
        for run in runs:
            if crash is not None and len([o for o in outcomes if o.backend_id]) >= crash:
                self._crash(runs, outcomes)
            plan = plans.get(id(run.settings))
            if plan is None:
                plan = plans[id(run.settings)] = self._plan(run.settings)
            try:
                backend_id, start, end, final = self._start(run, counted, now, plan)
            except SubmitError as exc:
                outcomes.append(SubmitOutcome(run.fqid, None, str(exc)))
                continue
            outcomes.append(SubmitOutcome(run.fqid, backend_id))
            schedule.add(run.fqid, backend_id, start, end, final)
        self._count(counted)
        accepted = [(run.key, o.backend_id) for run, o in zip(runs, outcomes, strict=True) if o.backend_id]
        self._record(accepted)
        if not runs or not runs[0].settings.get("polled", False):
            self._schedule(schedule)
        await anyio.lowlevel.checkpoint()
        return outcomes

    async def submit(self, run: RunSpec) -> str:
        self.calls["submit"] += 1
        await anyio.lowlevel.checkpoint()
        if self._fault("submit") == "raise":
            raise ConnectionError("sim: backend unreachable (faults.json)")
        counted: list[str] = []
        try:
            backend_id, start, end, final = self._start(run, counted, time.time())
        finally:
            self._count(counted)
        self._record([(run.key, backend_id)])
        if not run.settings.get("polled", False):
            schedule = _Schedule()
            schedule.add(run.fqid, backend_id, start, end, final)
            self._schedule(schedule)
        return backend_id

    def _crash_after(self) -> int | None:
        try:
            faults = json.loads(self.faults_file.read_text(encoding="utf-8") or "{}")
        except (FileNotFoundError, ValueError):
            return None
        value = faults.get("crash_after") if isinstance(faults, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def _crash(self, runs: Sequence[RunSpec], outcomes: list[SubmitOutcome]) -> None:
        """The process dies here: the backend has the runs taken so far, the orchestrator never hears of them."""
        self._record([(run.key, o.backend_id) for run, o in zip(runs, outcomes, strict=False) if o.backend_id])
        os.kill(os.getpid(), signal.SIGKILL)

    def _count(self, fqids: list[str]) -> None:
        if fqids:
            with open(self.counts, "a", encoding="utf-8") as f:
                f.write("".join(f"{fq}\n" for fq in fqids))

    # ------------------------------------------------------------ the runs' course
    def _schedule(self, schedule: _Schedule) -> None:
        """Runs go running and end at the times written in their ids (a heap entry per batch that starts, and
        per batch that ends, together)."""
        if self._gone:
            self._gone.difference_update(schedule.ids)
        for kind, batches in (("start", schedule.starts), ("end", schedule.ends)):
            for at, batch in batches.items():
                heapq.heappush(self._heap, (at, next(self._seq), kind, batch))
        self._wake.set()

    async def track(self, handles: Sequence[RunHandle]) -> None:
        schedule = _Schedule()
        for h in handles:
            schedule.add(h.fqid, h.backend_id, *_fate(h.backend_id))
        self._schedule(schedule)

    async def status_bulk(self, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        """The polled mode: each run's status from the times in its id (faults from ``faults.json``)."""
        self.calls["status_bulk"] += 1
        fault = self._fault("status")
        if fault == "alternate":
            self._alternate += 1
            fault = "raise" if self._alternate % 2 else "garbage"
        if fault == "raise":
            raise ConnectionError("sim: backend down (faults.json)")
        if fault == "garbage":
            first = handles[0].fqid if handles else "0"
            return [StatusUpdate("9.9", "weird"), "garbage", StatusUpdate(first, "bogus")]  # type: ignore[arg-type,list-item]
        now = time.time()
        updates = []
        for h in handles:
            if h.backend_id in self._gone:
                continue
            start, end, final = _fate(h.backend_id)
            if now >= end:
                updates.append(StatusUpdate(h.fqid, *_ENDING[final]))
            elif now >= start and h.status == JobStatus.SUBMITTED:
                updates.append(StatusUpdate(h.fqid, JobStatus.RUNNING))
        await anyio.lowlevel.checkpoint()
        return updates

    async def forget(self, handles: Sequence[RunHandle]) -> None:
        self._gone.update(h.backend_id for h in handles)

    async def kill_bulk(self, handles: Sequence[RunHandle]) -> list[str | None]:
        self.calls["kill_bulk"] += 1
        self._gone.update(h.backend_id for h in handles)
        await anyio.lowlevel.checkpoint()
        return [None] * len(handles)

    async def kill(self, handle: RunHandle) -> None:
        self.calls["kill"] += 1
        self._gone.add(handle.backend_id)
        await anyio.lowlevel.checkpoint()

    async def serve(self) -> None:
        """Report runs running as soon as they are out, and ended when their time comes."""
        while True:
            if not self._heap:
                self._wake = anyio.Event()
                await self._wake.wait()
                continue
            delay = self._heap[0][0] - time.time()
            if delay > 0:
                self._wake = anyio.Event()
                with anyio.move_on_after(delay):
                    await self._wake.wait()
                continue
            _, _, kind, (fqids, ids, finals) = heapq.heappop(self._heap)
            gone = self._gone
            if kind == "start":
                running = JobStatus.RUNNING
                updates = [StatusUpdate(fqid, running) for fqid, b in zip(fqids, ids, strict=True)
                           if not gone or b not in gone]
            else:
                updates = []
                for fqid, backend_id, final in zip(fqids, ids, finals, strict=True):
                    if gone and backend_id in gone:
                        gone.discard(backend_id)
                        continue
                    updates.append(StatusUpdate(fqid, *_ENDING[final]))
            if updates:
                await self.context.report(updates)
