"""Job definitions: what each job runs, held by the runtime (the state machine never sees them).

A top-level job's definition is its stored ``spec`` (application, files,
backend, retry policy, splitter, postprocessors, steps...). A subjob's is
its master's with the splitter's delta applied; deltas stay in the
repository and are read when runs are built, so a master of a million
subjobs holds one definition in memory, not a million.

From a definition come the :class:`~orchestrator.plugin.RunSpec` a driver
gets for each attempt, and the :class:`~orchestrator.core.events.Profile`
the state machine decides with (the backend's capabilities, the resolved
retry limits, what runs after the subjobs).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.actions import Rule, scaled
from ..core.analyser import Limits
from ..core.events import Profile
from ..core.ids import Runs
from ..core.instructions import AdjustRun, SetBackend
from ..core.splitters import apply_delta, deferred, is_deferred
from ..core.statuses import JobStatus
from ..plugin.contract import Capabilities, RunHandle, RunSpec
from ..plugin.contract import child_path as _child
from ..plugin.logs import get_logger
from . import registry
from .repository import Repository
from .workspace import Workspace

log = get_logger(component="definitions")


class Definitions:
    """Every job's definition; see the module docstring."""

    def __init__(self, repo: Repository, workspace: Workspace, *, retry_defaults: Mapping[str, Any],
                 max_restarts: int, extra_env: Callable[[], Mapping[str, str]],
                 capabilities: Callable[[str, Mapping[str, Any]], Capabilities],
                 actions: Sequence[Rule] = (), fail_on_missing_output: bool = True) -> None:
        self.repo = repo
        #: The setting of that name: what a job that does not say (``Job(fail_on_missing_output=None)``) gets.
        self.fail_on_missing_output = fail_on_missing_output
        #: The action table (``[[actions]]`` of the settings), checked when the home opened.
        self.actions = tuple(actions)
        self.workspace = workspace
        self._top: tuple[int, Path] = (-1, workspace.root)
        #: The prefix of idempotency keys, read from the repository when the home opens (a shared one's is
        #: every home's on it).
        self.home_key = ""
        self.retry_defaults = retry_defaults
        self.max_restarts = max_restarts
        self._extra_env = extra_env
        self._capabilities = capabilities
        self.specs: dict[int, dict[str, Any]] = {}
        self.names: dict[int, str] = {}
        #: Definitions changed since the last write (``SetBackend``, a comment...), and subjob deltas.
        self.dirty: set[int] = set()
        self.dirty_deltas: dict[tuple[int, int], dict[str, Any]] = {}
        #: The deltas of the flush under way, until it is committed.
        self.writing_deltas: dict[tuple[int, int], dict[str, Any]] = {}

    # ------------------------------------------------------------ the store
    def add(self, job: int, name: str, spec: dict[str, Any]) -> None:
        self.specs[job] = spec
        self.names[job] = name

    def forget(self, job: int) -> None:
        self.specs.pop(job, None)
        self.names.pop(job, None)
        self.dirty.discard(job)

    def spec(self, job: int) -> dict[str, Any]:
        return self.specs[job]

    def set_backend(self, job: int, backend: Mapping[str, Any], subjobs: Sequence[int] = ()) -> None:
        """``resubmit(backend=...)``: new settings for the job and, dropping their own, for these subjobs."""
        self.specs[job]["backend"] = dict(backend)
        self.dirty.add(job)
        if subjobs:
            for idx, delta in self.deltas(job, subjobs).items():
                if overrides_backend(delta):
                    self.dirty_deltas[(job, idx)] = {k: v for k, v in delta.items() if not k.startswith("backend.")}

    def set_run_settings(self, job: int, index: int | None, values: Mapping[str, Any]) -> None:
        """New backend settings for one run (an action-table rule's retry): a subjob's own, or the job's."""
        if index is None:
            self.specs[job]["backend"].setdefault("settings", {}).update(values)
            self.dirty.add(job)
            return
        delta = self.deltas(job, [index]).get(index, {})
        self.dirty_deltas[(job, index)] = {**delta, **{f"backend.{k}": v for k, v in values.items()}}

    # ------------------------------------------------------------ the core's edits
    def change_backend(self, ins: SetBackend) -> None:
        """``SetBackend``: the job's new backend settings, for it and every subjob."""
        backend = ins.backend
        data = backend.to_dict() if hasattr(backend, "to_dict") else dict(backend)
        self.set_backend(ins.job, data, range(ins.subjobs))

    def adjust(self, ins: AdjustRun) -> None:
        """``AdjustRun``: an action-table rule retries runs with other settings (more memory, more time, elsewhere).
        Carried out at once: the retry's submission that follows in the same step reads the new settings."""
        job = ins.runs.job
        for i in ins.runs.indexes if ins.runs.indexes is not None else [None]:
            spec = self.subjob_spec(job, i) if i is not None else self.spec(job)
            settings = spec["backend"].get("settings", {})
            if ins.setting is not None:
                try:
                    values = {ins.setting: scaled(ins.setting, settings.get(ins.setting), ins.factor, ins.cap)}
                except ValueError as exc:  # a value the job set that is not Slurm's form: left as it is
                    log.warning("rule could not change the setting", rule=ins.rule, setting=ins.setting,
                                error=str(exc))
                    continue
            else:
                values = dict(ins.values)
            self.set_run_settings(job, i, values)
            log.info("rule changed the run's settings", rule=ins.rule, fqid=f"{job}.{i}" if i is not None
                     else str(job), changed={k: f"{settings.get(k)} -> {v}" for k, v in values.items()})

    def deltas(self, job: int, indexes: Sequence[int]) -> dict[int, dict[str, Any]]:
        """The splitter's deltas of these subjobs (changes not yet written included)."""
        if isinstance(indexes, range) and indexes.step == 1 and len(indexes) > 900:
            rows = self.repo.all_deltas(job, start=indexes.start, stop=indexes.stop)
            out = {i: json.loads(d) if d else {} for i, d in zip(indexes, rows, strict=True)}
        else:
            out = {i: json.loads(d) if d else {} for i, (_, d) in self.repo.subjob_rows(job, indexes).items()}
        for pending in (self.writing_deltas, self.dirty_deltas):  # the newer last
            for (m, i), delta in pending.items():
                if m == job and i in out:
                    out[i] = delta
        return out

    def splitter(self, job: int) -> dict[str, Any] | None:
        """A master's splitter definition in full (a reopened home holds only its name until it is needed)."""
        found: dict[str, Any] | None = self.specs[job].get("splitter")
        return self.repo.stored_splitter(job) if is_deferred(found) else found

    def defer_splitter(self, job: int) -> None:
        """A master is split and its splitter stored: its parameters (a million argument lists) leave memory and
        are read from the repository when asked for (:meth:`splitter`), as a reopened home does."""
        spec = self.specs[job]
        found = spec.get("splitter")
        if found is not None and not is_deferred(found):
            spec["splitter"] = deferred(found)

    def subjob_spec(self, job: int, index: int) -> dict[str, Any]:
        return apply_delta(self.specs[job], self.deltas(job, [index]).get(index, {}))

    def held_settings(self, job: int, stored: Sequence[str | None]) -> list[Mapping[str, Any]]:
        """The backend settings runs of ``job`` are held with, from their deltas as stored (``None``: none, or a job
        that runs itself): each its master's, or its own where its delta overrides backend fields."""
        master = self.specs[job]
        common: Mapping[str, Any] = master["backend"].get("settings", {})
        out: list[Mapping[str, Any]] = []
        for text in stored:
            delta = json.loads(text) if text else None
            out.append(apply_delta(master, delta)["backend"].get("settings", {})
                       if delta and overrides_backend(delta) else common)
        return out

    # ------------------------------------------------------------ what the core decides with
    def profile(self, job: int, spec: Mapping[str, Any] | None = None) -> Profile:
        spec = spec if spec is not None else self.specs[job]
        backend = spec["backend"]
        caps = self._capabilities(backend["name"], backend.get("settings", {}))
        policy = spec.get("retry") or {}
        return Profile(
            backend=backend["name"], native_submit=caps.bulk_submit, native_kill=caps.bulk_kill,
            wrapper=caps.runs_wrapper, lookup=caps.lookup,
            limits=Limits.resolve(policy, self.retry_defaults),
            checkpointable=spec.get("steps") is not None, max_restarts=self.max_restarts,
            splits=spec.get("splitter") is not None,
            postprocess=bool(spec.get("postprocessors") or spec.get("merger")),
            notify_held=any("held" in (p.get("params") or {}).get("on", ()) for p in spec.get("postprocessors") or ()
                            if registry.is_notification(p)),
            prejob=spec.get("prejob") is not None, aggregator=spec.get("aggregator") is not None,
            min_success=float(spec.get("min_success", 1.0)),
            actions=tuple(r for r in self.actions if not r.backends or backend["name"] in r.backends),
            fail_on_missing_output=_given(spec.get("fail_on_missing_output"), self.fail_on_missing_output),
        )

    # ------------------------------------------------------------ what a driver gets
    def run_specs(self, runs: Runs, attempts: Sequence[int], retry_args: Mapping[int, Sequence[str]]) -> list[RunSpec]:
        """A driver's view of each run of the batch, at the attempt it was sent under."""
        job = runs.job
        master = self.specs[job]
        extra = self._extra_env()
        common = self._shared(job, master, extra)  # what runs without a delta of their own share: one object each
        if runs.indexes is None:
            return [self._run_spec((job,), master, attempts[0], retry_args.get(0, ()), common)]
        deltas = self.deltas(job, runs.indexes)
        out = []
        for k, i in enumerate(runs.indexes):
            delta = deltas.get(i)
            args = None
            if not delta:
                spec, shared = master, common
            elif len(delta) == 1 and "application.args" in delta:  # the usual delta: nothing else changes
                spec, shared, args = master, common, delta["application.args"]
            else:
                spec = apply_delta(master, delta)
                shared = self._shared(job, spec, extra) if any(_changes_shared(k) for k in delta) else common
            out.append(self._run_spec((job, i), spec, attempts[k], retry_args.get(i, ()), shared, args))
        return out

    def run_handle(self, key: tuple[int, int | None], backend_id: str, settings: Mapping[str, Any],
                   status: JobStatus, attempt: int) -> RunHandle:
        """A held run's handle, made when one is needed (the runtime holds runs compactly, :mod:`.held`)."""
        job, index = key
        fqid = f"{job}" if index is None else f"{job}.{index}"
        top = self._top_dir(job)
        jobdir = top if index is None else _child(top, str(index))
        spec = self.specs.get(job)
        return RunHandle(fqid, index or 0, backend_id, settings, _child(jobdir, "output"), status,
                         f"orch-{self.home_key}-{fqid}-{attempt}", attempt, jobdir,
                         spec.get("owner") if spec is not None else None)

    def _top_dir(self, job: int) -> Path:
        """A top-level job's directory, parsed once (the last one asked for is kept)."""
        if self._top[0] != job:
            self._top = (job, self.workspace.jobdir((job,)))
        return self._top[1]

    def _shared(self, job: int, spec: Mapping[str, Any], extra_env: Mapping[str, str]) -> dict[str, Any]:
        """The RunSpec fields every run made from ``spec`` has alike."""
        app = spec["application"]
        shared = self._top_dir(job) / "input"
        return {"env": {**extra_env, **app.get("env", {})}, "settings": dict(spec["backend"].get("settings", {})),
                "inputs": tuple(shared / os.path.basename(f) for f in spec.get("inputfiles", ())),
                "outputfiles": tuple(spec.get("outputfiles", ())), "owner": spec.get("owner")}

    def _run_spec(self, fq: tuple[int, ...], spec: Mapping[str, Any], attempt: int, retry_args: Sequence[str],
                  common: Mapping[str, Any], args: Sequence[str] | None = None) -> RunSpec:
        """One run's view; ``common``: its fields shared with the batch's other runs (:meth:`_shared`); ``args``:
        its arguments, where they are all its delta changes."""
        fqid = f"{fq[0]}.{fq[1]}" if len(fq) > 1 else f"{fq[0]}"
        top = self._top_dir(fq[0])
        child = _child
        jobdir = child(top, str(fq[1])) if len(fq) > 1 else top
        app = spec["application"]
        return RunSpec(
            fqid=fqid, index=fq[-1] if len(fq) > 1 else 0, attempt=attempt,
            key=f"orch-{self.home_key}-{fqid}-{attempt}",
            executable=app["exe"], args=tuple(app.get("args", ()) if args is None else args), env=common["env"],
            settings=common["settings"], inputs=common["inputs"], outputfiles=common["outputfiles"],
            jobdir=jobdir, inputdir=child(jobdir, "input"), outputdir=child(jobdir, "output"),
            workdir=child(jobdir, "work"),
            mode=spec.get("mode", "production"), retry_count=max(attempt - 1, 0), retry_args=tuple(retry_args),
            owner=common["owner"],
        )


def _given(value: bool | None, default: bool) -> bool:
    """A job's own choice, else the setting's."""
    return default if value is None else bool(value)


def overrides_backend(delta: Mapping[str, Any]) -> bool:
    """A subjob's delta sets backend fields of its own (``backend.<setting>``): its settings are not its master's."""
    return any(k.startswith("backend.") for k in delta)


def _changes_shared(key: str) -> bool:
    """Whether a delta's key changes what :meth:`Definitions._shared` makes (else a subjob shares its master's)."""
    return key in ("application.env", "inputfiles", "outputfiles") or key.startswith("backend.")
