"""``sim``: a simulated backend that runs no process.

For tests and plugin authors. Its behaviour is set per subjob index:

    Backend("sim", bulk=False, fail_submit=[1], run_seconds=0.1, outcome={2: "failed"})

``fail_submit`` lists indexes whose every submission fails, or maps an index
to how many of its first submissions fail; ``outcome`` maps an index to a
final status, or to a list of them, one per attempt (the job's submit counter). ``bulk`` picks native
(default) or emulated bulk. A run's whole fate is written into its backend
id when it is submitted, so status needs no memory and survives a restart of
the orchestrator. Every accepted run is also appended to a ledger,
``submissions.log`` in the driver's state dir (one write per call), the way a
real backend keeps its queue: ``lookup`` finds runs there by key, and tests
read it to prove that nothing was submitted twice. Written against the
public driver API only.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import anyio

from orchestrator import (
    Capabilities,
    Driver,
    DriverContext,
    JobStatus,
    RunHandle,
    RunSpec,
    SettingsError,
    StatusUpdate,
    SubmitError,
    SubmitOutcome,
)

FINALS = {"completed", "failed", "killed", "held"}


def _index_map(value: Any, field: str, check: Any) -> dict[int, Any]:
    items: Iterable[tuple[Any, Any]]
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = ((k, None) for k in value)
    else:
        raise SettingsError(field, f"{field} must be a list of indexes or a mapping, not {value!r}")
    out: dict[int, Any] = {}
    for key, v in items:
        try:
            index = int(key)
        except (TypeError, ValueError):
            raise SettingsError(field, f"{field}: {key!r} is not a subjob index") from None
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


class SimDriver(Driver):
    name = "sim"
    capabilities = Capabilities(bulk_submit=True, bulk_kill=True, bulk_status=True, lookup=True)
    _EMULATED = Capabilities(bulk_status=True, lookup=True)

    def __init__(self, context: DriverContext) -> None:
        super().__init__(context)
        #: Submissions per subjob seen by this process (``fail_submit`` counts; a failed
        #: submission does not count as an attempt of the job, so it is kept here).
        self._submits: dict[str, int] = {}
        self.calls: dict[str, int] = {"submit": 0, "submit_bulk": 0, "kill": 0, "kill_bulk": 0, "status_bulk": 0}
        self.ledger = context.statedir / "submissions.log"

    def _record(self, accepted: Sequence[tuple[str, str]]) -> None:
        """Append ``key backend_id`` lines, flushed to disk before the ids are returned."""
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

    @classmethod
    def validate_settings(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        known = {"bulk", "fail_submit", "run_seconds", "outcome"}
        for key in settings:
            if key not in known:
                raise SettingsError(key, f"backend 'sim' takes no setting {key!r} (it takes {sorted(known)})")
        bulk = settings.get("bulk", True)
        if not isinstance(bulk, bool):
            raise SettingsError("bulk", f"bulk must be true or false, not {bulk!r}")
        seconds = settings.get("run_seconds", 0.1)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            raise SettingsError("run_seconds", f"run_seconds must be a number >= 0, not {seconds!r}")
        out = dict(settings)
        fails = _index_map(settings.get("fail_submit", []), "fail_submit", _times)
        outcomes = _index_map(settings.get("outcome", {}), "outcome", _outcome)
        out["fail_submit"] = {str(k): v for k, v in fails.items()}  # JSON keys: they are stored
        out["outcome"] = {str(k): v for k, v in outcomes.items()}
        return out

    def capabilities_for(self, settings: Mapping[str, Any]) -> Capabilities:
        return self.capabilities if settings.get("bulk", True) else self._EMULATED

    def _start(self, run: RunSpec) -> str:
        """Decide the run's fate now; raise SubmitError for a failing submission."""
        n = self._submits[run.fqid] = self._submits.get(run.fqid, 0) + 1
        fail = _index_map(run.settings.get("fail_submit", {}), "fail_submit", _times)
        if run.index in fail:
            limit = fail[run.index]
            if limit is None or n <= limit:
                raise SubmitError(f"sim: submission {n} of subjob {run.index} refused (fail_submit)")
        k = run.attempt  # the job's own submit counter: survives a restart of the orchestrator
        outcomes = _index_map(run.settings.get("outcome", {}), "outcome", _outcome).get(run.index, ["completed"])
        final = outcomes[min(k - 1, len(outcomes) - 1)]
        end = time.time() + float(run.settings.get("run_seconds", 0.1))
        return f"sim:{run.fqid}:{k}:{end:.6f}:{final}"

    async def submit(self, run: RunSpec) -> str:
        self.calls["submit"] += 1
        await anyio.lowlevel.checkpoint()
        backend_id = self._start(run)
        self._record([(run.key, backend_id)])
        return backend_id

    async def submit_bulk(self, runs: Sequence[RunSpec]) -> list[SubmitOutcome]:
        self.calls["submit_bulk"] += 1
        outcomes = []
        for run in runs:
            try:
                outcomes.append(SubmitOutcome(run.fqid, self._start(run)))
            except SubmitError as exc:
                outcomes.append(SubmitOutcome(run.fqid, None, str(exc)))
        self._record([(run.key, o.backend_id) for run, o in zip(runs, outcomes, strict=True) if o.backend_id])
        await anyio.lowlevel.checkpoint()
        return outcomes

    async def kill(self, handle: RunHandle) -> None:
        self.calls["kill"] += 1
        await anyio.lowlevel.checkpoint()

    async def kill_bulk(self, handles: Sequence[RunHandle]) -> list[str | None]:
        self.calls["kill_bulk"] += 1
        await anyio.lowlevel.checkpoint()
        return [None] * len(handles)

    async def status_bulk(self, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        self.calls["status_bulk"] += 1
        now = time.time()
        updates = []
        for h in handles:
            try:
                _, _, _, end, final = h.backend_id.rsplit(":", 4)
                ends = float(end)
            except ValueError:
                updates.append(StatusUpdate(h.fqid, JobStatus.FAILED, reason=f"sim: unreadable id {h.backend_id!r}"))
                continue
            if now >= ends:
                status = JobStatus(final)
                if status != h.status:
                    reason = None if final == "completed" else f"sim: outcome {final}"
                    updates.append(StatusUpdate(h.fqid, status, exit_code=0 if final == "completed" else 1,
                                                reason=reason))
            elif h.status == JobStatus.SUBMITTED:
                updates.append(StatusUpdate(h.fqid, JobStatus.RUNNING))
        await anyio.lowlevel.checkpoint()
        return updates
