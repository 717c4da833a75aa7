"""The ssh driver's base: its settings, its pool of hosts, and the placement of runs over their slots.

:class:`SshBase` holds what every part of :class:`~orch_ssh.SshDriver` shares
(tuning, counters, the hosts by account and work dir, the launcher's wake-up
event); :meth:`SshBase._spread` hands runs to the hosts with the most free
slots, and :meth:`SshBase.free_slots` says how many that is. The helpers
below are shared by the submit, launch and monitoring paths.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from orchestrator.plugin import Driver, DriverContext, RunHandle, RunSpec
from orchestrator.plugin.accounts import AccountError, account_of

from .host import ACTIVE, LAUNCHING, QUEUED, UNVERIFIED, Host, RemoteFailed, Run, Tuning
from .settings import DEFAULT_KNOWN_HOSTS, DEFAULT_SLOTS, HostSpec, known_hosts_of, parse_host

try:  # the State API's directory in a run's $ORCH_HOME (checkpointing)
    from orchestrator.plugin.wrapper import STATE_DIR as STATE_DIR  # (re-exported to the driver's parts)
except ImportError:  # a core without checkpointing
    STATE_DIR = ".orch-state"

_DEFAULT = object()  # "known_hosts" absent from the settings (not the same as None: no checking)


def _backend_id(key: str, label: str) -> str:
    return f"{key}@{label}"


def _split_id(backend_id: str) -> tuple[str, str]:
    key, sep, label = backend_id.partition("@")
    if not sep or not key or not label:
        raise ValueError(f"{backend_id!r} is not an ssh backend id (key@user@host:port)")
    return key, label


class SshBase(Driver):
    """State shared by the ssh driver's parts, the host pool and the placement of runs (see :mod:`orch_ssh`)."""

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
        self.hosts: dict[tuple[str, str | None, str | None, str, str | None], Host] = {}
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

    def metrics(self) -> dict[str, Any]:
        """Remote commands and transfers (in total and per host), and per monitoring tick what it ran and watched."""
        return {"calls": dict(self.calls), "ticks": self.ticks, "tick_commands": list(self.tick_commands),
                "tick_runs": list(self.tick_runs)}

    # ------------------------------------------------------------------ hosts
    def _count(self, kind: str, label: str, tally: dict[str, int] | None) -> None:
        self.calls[kind] += 1
        self.calls[f"{kind}:{label}"] += 1
        if tally is not None:
            tally[label] = tally.get(label, 0) + 1

    def _host(self, settings: Mapping[str, Any], label: str, owner: str | None = None) -> Host:
        """The pooled host for ``label`` under these settings: one connection per owner, account and work dir.

        A run of an owner other than this process's user (``RunSpec.owner``) logs in as the owner, with the key
        and known_hosts files of the settings read with the owner's rights (``~`` is the owner's home; by default
        the owner's ``~/.ssh/known_hosts``); a host entry naming another user is refused (:class:`HostError`).
        """
        raw = (label, settings.get("key"), settings.get("known_hosts", _DEFAULT), settings.get("workdir"), owner)
        host = self._by_raw.get(raw)  # every handle asks, every tick: skip parsing when seen before
        if host is None:
            spec: HostSpec = parse_host(label)
            key = settings.get("key")
            known_hosts = known_hosts_of(settings)
            try:
                account = account_of(owner)
            except AccountError as exc:
                raise RemoteFailed(f"{spec.label}: {exc}") from None
            if account is not None:
                if spec.user != account.name:
                    raise RemoteFailed(f"{spec.label}: a run of {account.name} logs in as {account.name}, "
                                       f"not as {spec.user} (name the host without a user, or as {account.name}@)")
                key = account.expand(key) if key is not None else None
                known_hosts = (account.expand(DEFAULT_KNOWN_HOSTS) if "known_hosts" not in settings
                               else None if known_hosts is None else account.expand(known_hosts))
            workdir = str(settings["workdir"])
            ident = (spec.label, key, known_hosts, workdir, owner if account is not None else None)
            host = self.hosts.get(ident)
            if host is None:
                host = self.hosts[ident] = Host(spec, key=key, known_hosts=known_hosts, workdir=workdir,
                                                namespace=self.namespace, tuning=self.tuning, log=self.log,
                                                count=self._count, account=account)
            self._by_raw[raw] = host
        host.slots = int(settings.get("slots", DEFAULT_SLOTS))
        return host

    def _locate(self, handle: RunHandle) -> tuple[Host, str]:
        key, label = _split_id(handle.backend_id)
        return self._host(handle.settings, label, handle.owner), key

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


def _unsure(entry: Run) -> None:
    """A command about ``entry`` may or may not have run: unless its events said more, ask the host next tick."""
    if entry.state in (QUEUED, LAUNCHING, UNVERIFIED):
        entry.state = UNVERIFIED
        entry.since = time.monotonic()


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
