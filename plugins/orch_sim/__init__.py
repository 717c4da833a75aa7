"""``sim``: a simulated backend that runs no process.

For tests and plugin authors. Its behaviour is set per subjob index:

    Backend("sim", bulk=False, fail_submit=[1], run_seconds=0.1, outcome={2: "failed"})

``fail_submit`` lists indexes whose every submission fails, or maps an index
to how many of its first submissions fail (counted in the driver's state
dir, so across restarts); ``outcome`` maps an index to a final status, or to
a list of them, one per attempt. ``bulk`` picks native (default) or emulated
bulk. A run's whole fate is written into its backend id when it is
submitted, so it survives a restart of the orchestrator.

It is a reporting driver: a timer heap says when runs end, and it reports
them then, so a thousand idle runs cost nothing. Every accepted run is
appended to a ledger, ``submissions.log`` in the state dir (one write per
call), the way a real backend keeps its queue: ``lookup`` finds runs there
by key, and tests read it to prove that nothing was submitted twice.
Written against the plugin SDK only.
"""

from __future__ import annotations

import heapq
import itertools
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


@dataclass(frozen=True)
class SimSettings(Settings):
    bulk: bool = True
    run_seconds: float = 0.1
    fail_submit: Any = field(default_factory=list)
    outcome: Any = field(default_factory=dict)

    def check(self) -> None:
        if self.run_seconds < 0:
            raise SettingsError("run_seconds", f"run_seconds must be a number >= 0, not {self.run_seconds!r}")
        _index_map(self.fail_submit, "fail_submit", _times)
        _index_map(self.outcome, "outcome", _outcome)


class SimDriver(Driver):
    name = "sim"
    settings = SimSettings
    capabilities = Capabilities(bulk_submit=True, bulk_kill=True, lookup=True, reports=True)
    _EMULATED = Capabilities(lookup=True, reports=True)

    def __init__(self, context: DriverContext) -> None:
        super().__init__(context)
        self.ledger = context.statedir / "submissions.log"
        self.counts = context.statedir / "submit-counts.log"
        self._submits = self._read_counts()
        #: (time, sequence, "start" or "end", the runs: (fqid, backend id, final status))
        self._heap: list[tuple[float, int, str, list[tuple[str, str, str]]]] = []
        self._seq = itertools.count()
        self._gone: set[str] = set()
        self._wake = anyio.Event()
        self.calls: dict[str, int] = {"submit": 0, "submit_bulk": 0, "kill": 0, "kill_bulk": 0}

    @classmethod
    def validate_settings(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        out = super().validate_settings(settings)
        if "fail_submit" in out:  # JSON keys: the settings are stored
            out["fail_submit"] = {str(k): v for k, v in _index_map(out["fail_submit"], "fail_submit",
                                                                   _times).items()}
        if "outcome" in out:
            out["outcome"] = {str(k): v for k, v in _index_map(out["outcome"], "outcome", _outcome).items()}
        return out

    def capabilities_for(self, settings: Mapping[str, Any]) -> Capabilities:
        return self.capabilities if settings.get("bulk", True) else self._EMULATED

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
    def _start(self, run: RunSpec, counted: list[str], now: float) -> str:
        """Decide the run's fate now; raise SubmitError for a failing submission."""
        n = self._submits[run.fqid] = self._submits.get(run.fqid, 0) + 1
        counted.append(run.fqid)
        fail = _index_map(run.settings.get("fail_submit", {}), "fail_submit", _times)
        if run.index in fail:
            limit = fail[run.index]
            if limit is None or n <= limit:
                raise SubmitError(f"sim: submission {n} of subjob {run.index} refused (fail_submit)")
        outcomes = _index_map(run.settings.get("outcome", {}), "outcome", _outcome).get(run.index, ["completed"])
        final = outcomes[min(run.attempt - 1, len(outcomes) - 1)]
        end = now + float(run.settings.get("run_seconds", 0.1))  # one end per call: a batch ends together
        return f"sim:{run.fqid}:{run.attempt}:{end:.6f}:{final}"

    async def submit_bulk(self, runs: Sequence[RunSpec]) -> list[SubmitOutcome]:
        self.calls["submit_bulk"] += 1
        outcomes = []
        counted: list[str] = []
        now = time.time()
        for run in runs:
            try:
                outcomes.append(SubmitOutcome(run.fqid, self._start(run, counted, now)))
            except SubmitError as exc:
                outcomes.append(SubmitOutcome(run.fqid, None, str(exc)))
        self._count(counted)
        accepted = [(run.key, o.backend_id) for run, o in zip(runs, outcomes, strict=True) if o.backend_id]
        self._record(accepted)
        self._schedule([(run.fqid, b) for run, (_, b) in zip((r for r, o in zip(runs, outcomes, strict=True)
                                                                if o.backend_id), accepted, strict=True)])
        await anyio.lowlevel.checkpoint()
        return outcomes

    async def submit(self, run: RunSpec) -> str:
        self.calls["submit"] += 1
        await anyio.lowlevel.checkpoint()
        counted: list[str] = []
        try:
            backend_id = self._start(run, counted, time.time())
        finally:
            self._count(counted)
        self._record([(run.key, backend_id)])
        self._schedule([(run.fqid, backend_id)])
        return backend_id

    def _count(self, fqids: list[str]) -> None:
        if fqids:
            with open(self.counts, "a", encoding="utf-8") as f:
                f.write("".join(f"{fq}\n" for fq in fqids))

    # ------------------------------------------------------------ the runs' course
    def _schedule(self, runs: Sequence[tuple[str, str]]) -> None:
        """Runs go running at once and end at the time written in their id: two heap entries per batch."""
        by_end: dict[float, list[tuple[str, str, str]]] = {}
        for fqid, backend_id in runs:
            self._gone.discard(backend_id)
            try:
                _, _, _, end, final = backend_id.rsplit(":", 4)
                by_end.setdefault(float(end), []).append((fqid, backend_id, final))
            except ValueError:
                by_end.setdefault(0.0, []).append((fqid, backend_id, "failed"))
        now = time.time()
        for end, batch in by_end.items():
            heapq.heappush(self._heap, (now, next(self._seq), "start", batch))
            heapq.heappush(self._heap, (end, next(self._seq), "end", batch))
        self._wake.set()

    async def track(self, handles: Sequence[RunHandle]) -> None:
        self._schedule([(h.fqid, h.backend_id) for h in handles])

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
            _, _, kind, batch = heapq.heappop(self._heap)
            if kind == "start":
                updates = [StatusUpdate(fqid, JobStatus.RUNNING) for fqid, b, _ in batch if b not in self._gone]
            else:
                updates = []
                for fqid, backend_id, final in batch:
                    if backend_id in self._gone:
                        self._gone.discard(backend_id)
                        continue
                    updates.append(StatusUpdate(fqid, JobStatus(final), exit_code=0 if final == "completed" else 1,
                                                reason=None if final == "completed" else f"sim: outcome {final}"))
            if updates:
                await self.context.report(updates)
