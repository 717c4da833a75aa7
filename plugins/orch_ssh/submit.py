"""The ssh driver's submit and launch path.

``submit_bulk`` spreads runs over the hosts by free slots, stages the shared
inputs once per host with SFTP, and prepares every run of a host (and starts
those that fit) with one remote command per host. ``serve`` starts the runs
left queued as slots free up: one launch command per host per round.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from orchestrator.plugin import RunSpec, SubmitError, SubmitOutcome
from orchestrator.plugin.wrapper import clear_outputs, decimal, render_runfile

from . import scripts
from .host import LAUNCHED, LAUNCHING, QUEUED, RUNNING, UNVERIFIED, Dropped, Host, HostError, Run, Unreachable
from .placement import STATE_DIR, SshBase, _backend_id, _unsure
from .settings import known_hosts_of


class SubmitMixin(SshBase):
    """Submission (spread, stage, prepare, start) and the launcher of queued runs."""

    # ----------------------------------------------------------------- submit
    async def submit(self, run: RunSpec) -> str:
        outcome = (await self.submit_bulk([run]))[0]
        if not outcome.ok or outcome.backend_id is None:
            raise SubmitError(outcome.error or "submission refused")
        return outcome.backend_id

    async def submit_bulk(self, runs: Sequence[RunSpec]) -> list[SubmitOutcome]:
        """Spread, stage and start ``runs``: one remote command per host; raise if no run got anywhere."""
        outcomes: dict[str, SubmitOutcome] = {}
        groups: dict[tuple[Any, ...], list[RunSpec]] = {}
        for run in runs:
            s = run.settings
            ident = (tuple(s.get("hosts", ())), s.get("key"), known_hosts_of(s), s.get("workdir"), run.owner)
            groups.setdefault(ident, []).append(run)
        for group in groups.values():
            try:
                candidates = [self._host(group[0].settings, label, group[0].owner)
                              for label in group[0].settings["hosts"]]
            except HostError as refused:  # the owner may not log in so (another user named, no account here)
                self._reject(group, outcomes, str(refused))
                continue
            pending: list[RunSpec] = list(group)
            errors: dict[str, str] = {}
            while pending and candidates:
                plan = self._spread(candidates, pending)
                failed: dict[Host, HostError] = {}
                async with anyio.create_task_group() as tg:
                    for host, batch in plan.items():
                        tg.start_soon(self._submit_host, host, batch, outcomes, failed)
                pending = []
                for host, exc in failed.items():
                    errors[host.label] = str(exc)
                    candidates.remove(host)
                    if isinstance(exc, Unreachable):  # nothing reached it: its runs may go elsewhere
                        pending += plan[host]
            for run in pending:
                outcomes[run.fqid] = SubmitOutcome(run.fqid, None, "; ".join(errors.values()) or "no host to run on")
        result = [outcomes[r.fqid] for r in runs]
        if not any(o.ok for o in result):  # nothing was started anywhere: a clean failure of the whole call
            raise SubmitError(next((o.error for o in result if o.error), "submission refused"))
        return result

    async def _submit_host(self, host: Host, batch: list[RunSpec], outcomes: dict[str, SubmitOutcome],
                           failed: dict[Host, HostError]) -> None:
        """Stage, prepare and start ``batch`` on ``host``; outcomes by fqid, or the host's error in ``failed``."""
        try:
            await host.connect()
            files: dict[str, Path] = {}
            for run in batch:
                for f in run.inputs:
                    files.setdefault(str(f), f)
                if run.inputdir.is_dir():
                    for f in sorted(run.inputdir.iterdir()):
                        if f.is_file():
                            files.setdefault(str(f), f)
            staged = await host.stage(list(files.values()))
            for run in batch:  # the state the core restores for this run (checkpointing), into its $ORCH_HOME
                if (run.workdir / STATE_DIR).is_dir():
                    await host.upload_dir(run.workdir / STATE_DIR, f"{host.base}/{scripts.run_dir(run.key)}/work")
        except Dropped as exc:  # staging only: nothing was started, the runs may go to another host
            failed[host] = Unreachable(str(exc))
            return
        except HostError as exc:
            failed[host] = exc
            return
        except OSError as exc:  # a local input file went missing
            self._reject(batch, outcomes, f"staging inputs: {exc}")
            return
        preps = []
        for run in batch:
            clear_outputs(run.outputdir)
            run.outputdir.mkdir(parents=True, exist_ok=True)
            rdir = f"{host.base}/{scripts.run_dir(run.key)}"
            text = render_runfile(run, bindir=host.bindir, notify=host.events, boot=host.boot,
                                  paths={"outputdir": f"{rdir}/output", "workdir": f"{rdir}/work"},
                                  inputs=[staged[str(f)] for f in run.inputs])
            names = {}
            for f in [*run.inputs, *[p for p in files.values() if p.parent == run.inputdir]]:
                names[f.name] = staged[str(f)]
            preps.append(scripts.Prep(run.key, text, tuple(names.values())))
        free = max(host.slots - host.load(RUNNING), 0)
        now_keys = [p.key for p in preps[:free]]
        tracked = [host.run(run.key) for run in batch]
        for entry, run in zip(tracked, batch, strict=True):
            host.mine[entry.key] = math.inf  # holds its slot while the command is out; no tick forgets it
            entry.local_workdir = run.workdir
        for entry in tracked[:free]:
            entry.advance(LAUNCHING)
        lifts = [(run.key, host.fences[run.key]) for run in batch if run.key in host.fences]
        try:
            out = await host.command("submit", scripts.submit(host.base, host.bindir, preps, now_keys, time.time(),
                                                              lifts))
        except Dropped as exc:
            # It may or may not have run: claim the runs, and let the next tick ask the host where each stands.
            self.log.warning("ssh submission interrupted; the runs will be looked up on the host", host=host.label,
                             error=str(exc), runs=len(batch))
            for entry in tracked:
                _unsure(entry)
            self._accept(batch, host, outcomes)
            return
        except HostError as exc:  # nothing reached it, or it exited before preparing anything
            for entry in tracked:
                host.mine.pop(entry.key, None)
                if entry.state in (UNVERIFIED, LAUNCHING):
                    host.runs.pop(entry.key, None)
            failed[host] = exc
            if not isinstance(exc, Unreachable):
                self._reject(batch, outcomes, str(exc))
            return
        for key, _ in lifts:  # (kept after a failure: a fence that is still up is taken down next time)
            host.fences.pop(key, None)
        lines = out.decode(errors="replace").splitlines()
        complete = "OK" in lines
        prepared, started = set(), {}
        for line in lines:
            w = line.split()
            if len(w) >= 2 and w[0] == "P":
                prepared.add(w[1])
            elif len(w) == 3 and w[0] == "L" and (pid := decimal(w[2])) is not None:
                started[w[1]] = pid
        for entry in tracked:
            # A monitor tick may already have read this run's events: states only ever move forward.
            if entry.key in started:
                entry.pid = entry.pid or started[entry.key]
                entry.advance(LAUNCHED)
            elif complete and entry.key in prepared and entry.key not in now_keys and entry.state == UNVERIFIED:
                entry.advance(QUEUED)
                host.queue.append(entry)
            else:  # its guard existed already, or the answer was cut: ask the host next tick
                _unsure(entry)
        self._accept(batch, host, outcomes)
        if host.queue:
            self._wake.set()

    @staticmethod
    def _accept(batch: list[RunSpec], host: Host, outcomes: dict[str, SubmitOutcome]) -> None:
        now = time.monotonic()
        for run in batch:
            host.mine[run.key] = now
            outcomes[run.fqid] = SubmitOutcome(run.fqid, _backend_id(run.key, host.label))

    @staticmethod
    def _reject(batch: list[RunSpec], outcomes: dict[str, SubmitOutcome], error: str) -> None:
        for run in batch:
            outcomes[run.fqid] = SubmitOutcome(run.fqid, None, error)

    # ------------------------------------------------------------------ serve
    async def serve(self) -> None:
        """Start queued runs as slots free up: one launch command per host per round."""
        while True:
            with anyio.move_on_after(1.0):  # also wakes when a reconnect backoff has passed
                await self._wake.wait()
            self._wake = anyio.Event()
            busy = [h for h in self.hosts.values() if h.queue]
            if not busy:
                continue
            try:
                async with anyio.create_task_group() as tg:
                    for host in busy:
                        tg.start_soon(self._launch_queued, host)
            except Exception as exc:  # a surprise here must not end the orchestrator's task group
                self.log.error("ssh launcher failed; retrying", error=repr(exc))

    async def _launch_queued(self, host: Host) -> None:
        free = host.slots - host.load(RUNNING)
        if free <= 0 or not host.may_try():
            return
        batch: list[Run] = []
        while host.queue and len(batch) < free:
            entry = host.queue.popleft()
            if entry.state == QUEUED and entry.key in host.mine:  # (a run killed or forgotten meanwhile stays put)
                batch.append(entry)
        if not batch:
            return
        for entry in batch:
            entry.advance(LAUNCHING)
        try:
            out = await host.command("launch", scripts.launch(host.base, host.bindir, [e.key for e in batch],
                                                              time.time()))
        except HostError as exc:
            if isinstance(exc, Dropped):  # the next tick finds out whether each started
                for entry in batch:
                    _unsure(entry)
                return
            for entry in reversed(batch):  # nothing started: they wait for the next round
                if entry.state == LAUNCHING:
                    entry.state = QUEUED
                    host.queue.appendleft(entry)
            if not isinstance(exc, Unreachable):
                self.log.warning("ssh launch failed", host=host.label, error=str(exc))
            return
        except Exception as exc:  # never let a surprise end the orchestrator's task group
            self.log.error("ssh launch failed unexpectedly", host=host.label, error=repr(exc))
            for entry in batch:
                _unsure(entry)
            return
        started = {}
        for line in out.decode(errors="replace").splitlines():
            w = line.split()
            if len(w) == 3 and w[0] == "L" and (pid := decimal(w[2])) is not None:
                started[w[1]] = pid
        for entry in batch:
            if entry.key in started:
                entry.pid = entry.pid or started[entry.key]
                entry.advance(LAUNCHED)
            else:
                _unsure(entry)

