"""``ssh``: run jobs on remote hosts over SSH, through the job wrapper.

``Backend("ssh", hosts=["user@host:port", ...], key="~/.ssh/id_ed25519",
workdir="/remote/base", slots=4, known_hosts="~/.ssh/known_hosts")``.

The remote design mirrors the ``local`` driver's, so that what makes
``local`` safe across restarts holds over a network too:

* **One events file per host** (``<workdir>/<namespace>/events.log``) that
  every wrapper appends START and END lines to (``ORCH_NOTIFY``), next to
  our own INTENT / LAUNCH / CANCEL lines. Monitoring a host is ONE remote
  command per tick, whatever the number of runs: check the PIDs of running
  wrappers (``kill -0``), then ``tail`` the file from the byte offset read
  last time. ``calls`` and ``tick_commands`` count those commands.
* **A launch guard per run**, taken with ``O_EXCL`` by the one command that
  starts (or cancels) it. A command repeated after a dropped connection, a
  restart, or a kill racing a launch can never start a run twice.
* **Runs outlive the connection**: ``setsid sh wrapper.sh RUNFILE`` with
  stdio away from the channel; the wrapper's PID is its process group, so
  ``kill`` signals the group (TERM, then KILL after ``kill_grace``).
* **Adoption after a restart**: a run this process has not heard of is
  looked up in the host's events file (read from byte 0 on the first tick)
  and, if silent there, by its guard and run file, in the same one command.
* **Nothing is guessed**: when a connection drops *during* a start command,
  the runs are reported submitted and the next tick asks the host where
  each one stands (prepared: launch it; started: watch it; absent: lost).

Submission is natively bulk: runs are spread over the hosts by free slots
(``slots`` per host, the rest queued here and started as slots free up,
by one command per host), the master's shared inputs are staged once per
host with SFTP, and one remote command per host prepares every run (run
directories, run files rendered with remote paths, input links) and starts
those that fit. When a run ends its output dir is fetched back with SFTP
*before* the run is reported final, because the core reads ``orch.log``
from the local output dir to judge it.

Checkpointing (the core's hook for remote drivers): a run's starting state
(``RunSpec.workdir/.orch-state``) goes to the host with its inputs; the
states it saved come back with its output, before it is reported ended;
``fetch_states`` copies running runs' new states once a tick (one small
read per run unless its ``current`` changed). ``free_slots(settings)``
says how many runs the hosts could start now.

An unreachable host is a backend fault, never the job's: ``submit``
places runs on the hosts that answer (``SubmitError`` when none does);
``status_bulk`` raises when no host answers (the core backs off and counts
``lost_after_seconds``), and when only some do, reports the others and
counts silence per host itself. Connections come back by themselves, with
backoff. Host keys are checked against ``known_hosts`` (by default
``~/.ssh/known_hosts``); only ``known_hosts=None`` turns that off, loudly.

``[backends.ssh]`` in the configuration may set ``connect_timeout`` (10),
``command_timeout`` (60), ``status_timeout`` (20), ``keepalive_interval`` (15), ``max_sessions``
(8 channels per connection), ``kill_grace`` (2), ``launch_grace`` (30),
``lost_after_seconds`` (600, for a host silent while others answer) and
``fetch_concurrency`` (16). Written against the public driver API only.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from orchestrator import (
    Capabilities,
    Driver,
    DriverContext,
    JobStatus,
    RunHandle,
    RunSpec,
    StatusUpdate,
    SubmitError,
    SubmitOutcome,
)
from orchestrator.wrapper import clear_outputs, render_runfile

from . import scripts
from .host import (
    ACTIVE,
    ENDED,
    KILLED,
    LAUNCHED,
    LAUNCHING,
    LOST,
    QUEUED,
    RUNNING,
    STARTED,
    UNVERIFIED,
    Dropped,
    Host,
    HostError,
    RemoteFailed,
    Run,
    Tuning,
    Unreachable,
)
from .settings import DEFAULT_SLOTS, HostSpec, known_hosts_of, parse_host, validate

try:  # the State API's directory in a run's $ORCH_HOME (checkpointing)
    from orchestrator.checkpoint import STATE_DIR
except ImportError:  # a core without checkpointing
    STATE_DIR = ".orch-state"

__all__ = ["BackendFault", "SshDriver"]

S = JobStatus
_DEFAULT = object()  # "known_hosts" absent from the settings (not the same as None: no checking)
#: Seconds a launched wrapper whose PID is gone may take to show its START line before it is lost.
_START_GRACE = 3.0
_MARK = scripts.EVENTS_MARK.encode() + b"\n"


class BackendFault(RuntimeError):
    """No host of a status query answered: the core treats it as the backend's fault and backs off."""


def _backend_id(key: str, label: str) -> str:
    return f"{key}@{label}"


def _split_id(backend_id: str) -> tuple[str, str]:
    key, sep, label = backend_id.partition("@")
    if not sep or not key or not label:
        raise ValueError(f"{backend_id!r} is not an ssh backend id (key@user@host:port)")
    return key, label


class SshDriver(Driver):
    name = "ssh"
    capabilities = Capabilities(bulk_submit=True, bulk_kill=True, bulk_status=True, runs_wrapper=True,
                                remote_states=True)

    def __init__(self, context: DriverContext) -> None:
        super().__init__(context)
        cfg = context.config
        self.tuning = Tuning(
            connect_timeout=float(cfg.get("connect_timeout", 10.0)),
            command_timeout=float(cfg.get("command_timeout", 60.0)),
            keepalive_interval=float(cfg.get("keepalive_interval", 15.0)),
            max_sessions=int(cfg.get("max_sessions", 8)),
        )
        #: A status query waits at most this long for a host (a hung host must not stall monitoring long).
        self.status_timeout = float(cfg.get("status_timeout", 20.0))
        self.kill_grace = float(cfg.get("kill_grace", 2.0))
        self.launch_grace = float(cfg.get("launch_grace", 30.0))
        self.lost_after = float(cfg.get("lost_after_seconds", 600.0))
        self.fetch_concurrency = max(1, int(cfg.get("fetch_concurrency", 16)))
        self.log = context.log
        self.namespace = _namespace(context.statedir)
        self.hosts: dict[tuple[str, str | None, str | None, str], Host] = {}
        self._by_raw: dict[tuple[Any, ...], Host] = {}
        #: Remote commands and SFTP transfers by kind (``monitor``, ``submit``, ``launch``, ``kill``,
        #: ``setup``, ``connect``; SFTP: ``sftp_install``, ``sftp_stage``, ``sftp_get``), in total and per host
        #: (``kind:label``).
        self.calls: Counter[str] = Counter()
        #: Status queries answered (or attempted): the core's monitoring ticks for this backend.
        self.ticks = 0
        #: Per tick: host label -> remote commands that tick ran on it (the claim: one per host).
        self.tick_commands: deque[dict[str, int]] = deque(maxlen=100_000)
        #: Host label -> runs its tick looked at, alongside ``tick_commands``.
        self.tick_runs: deque[dict[str, int]] = deque(maxlen=100_000)
        self._silent_since: dict[str, float] = {}
        self._wake = anyio.Event()
        self._rotation = 0

    @classmethod
    def validate_settings(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        return validate(settings)

    # ------------------------------------------------------------------ hosts
    def _count(self, kind: str, label: str, tally: dict[str, int] | None) -> None:
        self.calls[kind] += 1
        self.calls[f"{kind}:{label}"] += 1
        if tally is not None:
            tally[label] = tally.get(label, 0) + 1

    def _host(self, settings: Mapping[str, Any], label: str) -> Host:
        """The pooled host for ``label`` under these settings (one connection per account and work dir)."""
        raw = (label, settings.get("key"), settings.get("known_hosts", _DEFAULT), settings.get("workdir"))
        host = self._by_raw.get(raw)  # every handle asks, every tick: skip parsing when seen before
        if host is None:
            spec: HostSpec = parse_host(label)
            key = settings.get("key")
            known_hosts = known_hosts_of(settings)
            workdir = str(settings["workdir"])
            ident = (spec.label, key, known_hosts, workdir)
            host = self.hosts.get(ident)
            if host is None:
                host = self.hosts[ident] = Host(spec, key=key, known_hosts=known_hosts, workdir=workdir,
                                                namespace=self.namespace, tuning=self.tuning, log=self.log,
                                                count=self._count)
            self._by_raw[raw] = host
        host.slots = int(settings.get("slots", DEFAULT_SLOTS))
        return host

    def _locate(self, handle: RunHandle) -> tuple[Host, str]:
        key, label = _split_id(handle.backend_id)
        return self._host(handle.settings, label), key

    def _spread(self, candidates: list[Host], runs: Sequence[RunSpec]) -> dict[Host, list[RunSpec]]:
        """Give each run to the host with the most free slots (never all to one while others have room).

        Free = slots - runs not yet over (queued ones included), counted as
        the plan grows. Hosts in reconnect backoff are left out unless every
        host is; ties go round-robin across calls.
        """
        usable = [h for h in candidates if h.may_try()] or list(candidates)
        shift = self._rotation % len(usable)
        self._rotation += 1
        order = usable[shift:] + usable[:shift]
        load = {h: h.load(ACTIVE) for h in order}
        plan: dict[Host, list[RunSpec]] = {h: [] for h in order}
        for run in runs:
            host = max(order, key=lambda h: (h.slots - load[h], -load[h]))
            plan[host].append(run)
            load[host] += 1
        return {h: batch for h, batch in plan.items() if batch}

    def free_slots(self, settings: Mapping[str, Any]) -> int:
        """Runs these settings' hosts could start now: the sum of each host's free slots.

        For a core that sizes partitions by the backend's capacity (``StepSplitter()``
        without ``m``); it is what :meth:`_spread` hands out.
        """
        hosts = [self._host(settings, label) for label in settings.get("hosts", ())]
        return sum(max(h.slots - h.load(ACTIVE), 0) for h in hosts)

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
            ident = (tuple(s.get("hosts", ())), s.get("key"), known_hosts_of(s), s.get("workdir"))
            groups.setdefault(ident, []).append(run)
        for group in groups.values():
            candidates = [self._host(group[0].settings, label) for label in group[0].settings["hosts"]]
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
                                  paths={"outputdir": f"{rdir}/output", "workdir": f"{rdir}/work"})
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
        try:
            out = await host.command("submit", scripts.submit(host.base, host.bindir, preps, now_keys, time.time()))
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
        lines = out.decode(errors="replace").splitlines()
        complete = "OK" in lines
        prepared, started = set(), {}
        for line in lines:
            w = line.split()
            if len(w) >= 2 and w[0] == "P":
                prepared.add(w[1])
            elif len(w) == 3 and w[0] == "L" and w[2].isdigit():
                started[w[1]] = int(w[2])
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
            if entry.state == QUEUED and entry.key in host.mine:  # (a run nobody watches any more stays put)
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
            if len(w) == 3 and w[0] == "L" and w[2].isdigit():
                started[w[1]] = int(w[2])
        for entry in batch:
            if entry.key in started:
                entry.pid = entry.pid or started[entry.key]
                entry.advance(LAUNCHED)
            else:
                _unsure(entry)

    # ----------------------------------------------------------------- status
    async def status(self, handle: RunHandle) -> StatusUpdate | None:
        updates = await self.status_bulk([handle])
        return updates[0] if updates else None

    async def status_bulk(self, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        """One remote command per host (concurrently), whatever the number of runs; ended runs fetched first."""
        self.ticks += 1
        began = time.monotonic()
        tally: dict[str, int] = {}
        updates: list[StatusUpdate] = []
        groups: dict[Host, list[RunHandle]] = {}
        watched: dict[Host, set[str]] = {}
        for h in handles:
            try:
                host, key = self._locate(h)
            except (ValueError, KeyError) as exc:
                updates.append(StatusUpdate(h.fqid, S.FAILED, reason=f"lost: {exc}"))
                continue
            groups.setdefault(host, []).append(h)
            watched.setdefault(host, set()).add(key)
        for host in self.hosts.values():  # the core watches every active run: the others are no longer ours
            host.prune(began, watched.get(host, set()))
        errors: dict[Host, BaseException] = {}
        async with anyio.create_task_group() as tg:
            for host, group in groups.items():
                tg.start_soon(self._poll, host, group, tally, updates, errors)
        self.tick_commands.append(tally)
        self.tick_runs.append({host.label: len(group) for host, group in groups.items()})
        if not errors:
            return updates
        if len(errors) == len(groups):
            raise BackendFault("; ".join(f"{h.label}: {e}" for h, e in errors.items()))
        now = time.monotonic()
        for host in errors:  # the others answered: this host's silence is counted here, per host
            since = self._silent_since.setdefault(host.label, now)
            if now - since < self.lost_after:
                continue
            reason = f"host {host.label} did not answer for {now - since:.0f} s ({errors[host]})"
            for h in groups[host]:
                entry = host.run(_split_id(h.backend_id)[0])
                entry.reason = reason
                entry.advance(LOST)
                updates.append(StatusUpdate(h.fqid, S.FAILED, reason=reason, backend_verdict="lost"))
        return updates

    async def _poll(self, host: Host, handles: list[RunHandle], tally: dict[str, int], updates: list[StatusUpdate],
                    errors: dict[Host, BaseException]) -> None:
        try:
            found = await self._poll_host(host, handles, tally)
        except HostError as exc:
            errors[host] = exc
            return
        except Exception as exc:  # a surprise is still the backend's fault, and must not cancel the other hosts
            self.log.error("ssh status failed unexpectedly", host=host.label, error=repr(exc))
            errors[host] = exc
            return
        self._silent_since.pop(host.label, None)
        updates.extend(found)

    async def _poll_host(self, host: Host, handles: list[RunHandle], tally: dict[str, int]) -> list[StatusUpdate]:
        pairs = [(h, host.run(_split_id(h.backend_id)[0])) for h in handles]
        pids = sorted({e.pid for _, e in pairs if e.state in (LAUNCHED, STARTED) and e.pid})
        unverified = [e.key for _, e in pairs if e.state == UNVERIFIED]
        script = scripts.monitor(host.base, pids, unverified, host.event_lines.offset)
        out = await host.command("monitor", script, tally, timeout=self.status_timeout)
        head, mark, events = out.partition(_MARK)
        if not mark:
            raise RemoteFailed(f"monitor on {host.label} answered without its events mark: {out[-200:]!r}")
        alive: set[int] = set()
        where: dict[str, str] = {}
        for line in head.decode(errors="replace").splitlines():
            w = line.split()
            if len(w) == 2 and w[0] == "A" and w[1].isdigit():
                alive.add(int(w[1]))
            elif len(w) == 3 and w[0] == "K":
                where[w[1]] = w[2]
        host.feed(events)
        for key, state in where.items():
            entry = host.runs.get(key)
            if entry is None or entry.state != UNVERIFIED:
                continue  # the events said more than the guard
            if state == "launched":
                entry.advance(LAUNCHED)
            elif state == "prepared":
                entry.advance(QUEUED)
                host.queue.append(entry)
                self._wake.set()
            else:
                entry.reason = f"the run never reached {host.label} (no run file there)"
                entry.advance(LOST)
        now = time.monotonic()
        checked = set(pids)
        to_fetch: list[tuple[RunHandle, Run]] = []
        freed = False
        for h, entry in pairs:
            if entry.state == STARTED and entry.pid in checked and entry.pid not in alive:
                entry.reason = "the wrapper ended without an END line (killed or crashed)"
                entry.advance(LOST)
            elif (entry.state == LAUNCHED and entry.pid in checked and entry.pid not in alive
                  and now - entry.since > _START_GRACE):
                # (A moment's grace: were ``setsid`` to fork, the PID we know would die before START names
                # the wrapper's own.)
                entry.reason = "the wrapper exited before it started the job (see wrapper.out on the host)"
                entry.advance(LOST)
            elif entry.state == LAUNCHED and entry.pid is None and now - entry.since > self.launch_grace:
                entry.reason = f"no sign of the wrapper {self.launch_grace:.0f} s after its launch"
                entry.advance(LOST)
            if entry.state in (ENDED, LOST) and not entry.fetched:
                freed = True
                to_fetch.append((h, entry))
        if to_fetch:
            await self._fetch(host, to_fetch)
        if freed and host.queue:
            self._wake.set()
        return [u for h, e in pairs if (u := _update(h, e)) is not None]

    async def _fetch(self, host: Host, items: list[tuple[RunHandle, Run]]) -> None:
        """Fetch ended runs' output dirs (concurrently); the first host error is raised after all tried."""
        limiter = anyio.CapacityLimiter(self.fetch_concurrency)
        problems: list[HostError] = []

        async def one(h: RunHandle, entry: Run) -> None:
            async with limiter:
                remote = f"{host.base}/{scripts.run_dir(entry.key)}"
                try:
                    await host.fetch(f"{remote}/output", h.outputdir)
                    # The states it saved, where the core harvests them before judging the run (checkpointing).
                    await host.fetch(f"{remote}/work/{STATE_DIR}", _local_workdir(h, entry) / STATE_DIR,
                                     create=False, kind="sftp_state")
                except Dropped as exc:  # try again next tick: the run is not final before its outputs are here
                    problems.append(exc)
                    return
                except (HostError, OSError) as exc:  # one unreadable file must not hold up the host's other runs
                    self.log.warning("ssh fetch incomplete; the run is judged on what arrived", fqid=h.fqid,
                                     host=host.label, error=str(exc))
                entry.fetched = True

        async with anyio.create_task_group() as tg:
            for h, entry in items:
                tg.start_soon(one, h, entry)
        if problems:
            raise problems[0]

    async def fetch_states(self, handles: Sequence[RunHandle], targets: Sequence[Path]) -> None:
        """Copy running runs' saved states into ``targets`` (the core's checkpointing hook, once a tick).

        Only a run whose ``current`` state number changed since the last copy
        is fetched whole: one small read per running run otherwise.
        """
        limiter = anyio.CapacityLimiter(self.fetch_concurrency)

        async def one(h: RunHandle, target: Path) -> None:
            try:
                host, key = self._locate(h)
            except (ValueError, KeyError):
                return
            remote = f"{host.base}/{scripts.run_dir(key)}/work/{STATE_DIR}"
            async with limiter:
                current = await host.read_small(f"{remote}/current")
                if current is None:
                    return
                try:
                    if (target / "current").read_bytes() == current:
                        return
                except OSError:
                    pass
                await host.fetch(remote, target, create=True, kind="sftp_state")

        async with anyio.create_task_group() as tg:
            for h, target in zip(handles, targets, strict=True):
                tg.start_soon(one, h, target)

    # ------------------------------------------------------------------- kill
    async def kill(self, handle: RunHandle) -> None:
        error = (await self.kill_bulk([handle]))[0]
        if error:
            raise RuntimeError(error)

    async def kill_bulk(self, handles: Sequence[RunHandle]) -> list[str | None]:
        """Cancel or signal runs: one remote command per host."""
        results: list[str | None] = [None] * len(handles)
        groups: dict[Host, list[tuple[int, str]]] = {}
        for i, h in enumerate(handles):
            try:
                host, key = self._locate(h)
            except (ValueError, KeyError) as exc:
                results[i] = str(exc)
                continue
            groups.setdefault(host, []).append((i, key))
        async with anyio.create_task_group() as tg:
            for host, items in groups.items():
                tg.start_soon(self._kill_host, host, items, results)
        return results

    async def _kill_host(self, host: Host, items: list[tuple[int, str]], results: list[str | None]) -> None:
        entries = [host.run(key) for _, key in items]
        waiting = {id(e) for e in entries if e.state == QUEUED}
        if waiting:  # out of the launch queue while the kill goes out; the guard settles any race
            host.queue = deque(e for e in host.queue if id(e) not in waiting)
            for e in entries:
                if id(e) in waiting:
                    e.state = UNVERIFIED
        targets = [(e.key, e.pid if e.state in (LAUNCHED, STARTED) else None) for e in entries]
        try:
            out = await host.command("kill", scripts.kill(host.base, targets, self.kill_grace, time.time()))
        except HostError as exc:
            for e in entries:  # not cancelled: back in the queue (after a drop, the next tick looks them up)
                if id(e) in waiting and e.state == UNVERIFIED and not isinstance(exc, Dropped):
                    e.advance(QUEUED)
                    host.queue.append(e)
            for i, _ in items:
                results[i] = f"{host.label}: {exc}"
            return
        except Exception as exc:  # reported per run; never crash the caller's task group
            for i, _ in items:
                results[i] = f"{host.label}: {exc!r}"
            return
        said: dict[str, str] = {}
        for line in out.decode(errors="replace").splitlines():
            w = line.split()
            if len(w) == 2 and w[0] in ("C", "T", "U"):
                said[w[1]] = w[0]
        for (i, key), e in zip(items, entries, strict=True):
            word = said.get(key)
            if word in ("C", "T"):
                e.reason = "cancelled before it started" if word == "C" else "killed"
                e.advance(KILLED)
                host.mine.pop(key, None)
            elif word == "U":
                results[i] = f"{host.label}: run {key} has started but its process group is not known yet; kill again"
            else:
                results[i] = f"{host.label}: no answer about run {key}"
        self._wake.set()

    # ------------------------------------------------------------------ close
    async def aclose(self) -> None:
        for host in self.hosts.values():
            await host.aclose()


def _unsure(entry: Run) -> None:
    """A command about ``entry`` may or may not have run: unless its events said more, ask the host next tick."""
    if entry.state in (QUEUED, LAUNCHING, UNVERIFIED):
        entry.state = UNVERIFIED
        entry.since = time.monotonic()


def _update(h: RunHandle, entry: Run) -> StatusUpdate | None:
    """The report for one run, or ``None`` when the core already knows it."""
    state = entry.state
    if state == ENDED:
        if entry.code == 0:
            update = StatusUpdate(h.fqid, S.COMPLETED, exit_code=0)
        else:
            update = StatusUpdate(h.fqid, S.FAILED, exit_code=entry.code, reason=f"exit code {entry.code}")
    elif state == LOST:
        if not entry.fetched:
            return None
        update = StatusUpdate(h.fqid, S.FAILED, reason=entry.reason)
    elif state == KILLED:
        update = StatusUpdate(h.fqid, S.KILLED, reason=entry.reason)
    elif state == STARTED:
        update = StatusUpdate(h.fqid, S.RUNNING)
    else:
        return None
    if state in (ENDED,) and not entry.fetched:
        return None  # never final before the output dir is here: the core reads orch.log from it
    return None if update.status == h.status else update


def _local_workdir(h: RunHandle, entry: Run) -> Path:
    """Where the run's states go locally: its ``RunSpec.workdir`` (after a restart, the workspace's layout)."""
    return entry.local_workdir if entry.local_workdir is not None else h.outputdir.parent / "work"


def _namespace(statedir: Path) -> str:
    """This home's directory name on remote hosts, kept in the driver's state dir (stable across restarts)."""
    path = statedir / "namespace"
    try:
        text = path.read_text().strip()
        if text:
            return text
    except FileNotFoundError:
        pass
    statedir.mkdir(parents=True, exist_ok=True)
    name = f"orch-{secrets.token_hex(4)}"
    path.write_text(name + "\n")
    return name
