"""One remote host of the ``ssh`` backend: its connection, its files, its runs as its events file tells.

A :class:`Host` is one account on one machine under one work dir. It owns
one asyncssh connection (channels multiplexed on it, bounded below sshd's
``MaxSessions``), one SFTP session, a reconnect backoff, the byte offset up
to which it has read the remote events file, and the state of every run it
has heard of. All remote work goes through :meth:`Host.command` and the
SFTP helpers, which turn asyncssh's many exceptions into three meanings the
driver acts on:

* :class:`Unreachable`: nothing reached the host (connect refused, timed
  out, host key rejected). Safe to try another host.
* :class:`Dropped`: the connection died or timed out *during* a command.
  The command may or may not have run; the driver never guesses, it asks
  the host again later (the launch guard makes asking safe).
* :class:`RemoteFailed`: the host answered, and the command failed.
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import asyncssh

from orchestrator.plugin.accounts import Account, AccountError, give, read_as
from orchestrator.plugin.wrapper import SCRIPTS, EventLines, decimal, event_pid, script_text

from . import scripts
from .settings import HostSpec

# Run states, in the order a run goes through them (a later state never goes back).
UNVERIFIED = "unverified"  # we do not know whether it was prepared or started: the next tick asks
QUEUED = "queued"  # prepared on the host, waiting for a free slot
LAUNCHING = "launching"  # a launch command for it is under way
LAUNCHED = "launched"  # the launch guard is taken (INTENT): the wrapper is starting
STARTED = "started"  # the wrapper wrote START
ENDED = "ended"  # the wrapper wrote END
LOST = "lost"  # it can no longer end normally (reason says why)
KILLED = "killed"  # cancelled before it started, or its process group was signalled
_RANK = {UNVERIFIED: 0, QUEUED: 1, LAUNCHING: 2, LAUNCHED: 3, STARTED: 4, ENDED: 5, LOST: 6, KILLED: 6}
#: States that hold one of the host's slots.
RUNNING = frozenset({LAUNCHING, LAUNCHED, STARTED, UNVERIFIED})
#: States not yet over (count towards the host's load when spreading new runs).
ACTIVE = RUNNING | {QUEUED}
#: States a run never leaves: it holds no slot, and is the driver's only while the core still watches it.
OVER = frozenset({ENDED, LOST, KILLED})

#: The wrapper scripts, and a hash of them that names their remote directory. An
#: installed bin dir is never rewritten: a wrapper that runs keeps reading its file.
SCRIPT_FILES = {name: script_text(name).encode() for name in SCRIPTS}
SCRIPTS_HASH = hashlib.sha256(b"\0".join(SCRIPT_FILES[n] for n in sorted(SCRIPT_FILES))).hexdigest()[:12]


class HostError(RuntimeError):
    """Something went wrong with a host; the message names it."""


class Unreachable(HostError):
    """Nothing reached the host: it may be tried again later, or another host used."""


class HostKeyRejected(Unreachable):
    """The host's key does not match ``known_hosts``: never accepted, never retried quietly."""


class Dropped(HostError):
    """The connection ended during a command: whether it ran is unknown."""


class RemoteFailed(HostError):
    """The host ran the command and it failed."""


def _bytes(data: bytes | str | None) -> bytes:
    """asyncssh types a process's output as bytes or str; with ``encoding=None`` it is bytes."""
    if data is None:
        return b""
    return data.encode() if isinstance(data, str) else bytes(data)


@dataclass
class Run:
    """What this process knows of one run (one key) on one host."""

    key: str
    state: str = UNVERIFIED
    pid: int | None = None
    code: int | None = None
    reason: str | None = None
    #: ``time.monotonic()`` of the last state change: how long a launch has waited for START.
    since: float = field(default_factory=time.monotonic)
    fetched: bool = False
    #: The run's local working directory (``RunSpec.workdir``), where the core reads saved states.
    local_workdir: Path | None = None

    def advance(self, state: str) -> None:
        """Move forward only: events may be replayed (after a restart) without undoing anything."""
        if _RANK[state] > _RANK[self.state] or (state == QUEUED and self.state == UNVERIFIED):
            self.state = state
            self.since = time.monotonic()


@dataclass(frozen=True, slots=True)
class Tuning:
    """Per-driver knobs from ``[backends.ssh]`` in the configuration."""

    connect_timeout: float = 10.0
    command_timeout: float = 60.0
    keepalive_interval: float = 15.0
    #: Concurrent channels per connection; sshd's default MaxSessions is 10 (one goes to SFTP).
    max_sessions: int = 8
    backoff_first: float = 0.25
    backoff_max: float = 5.0


class Host:
    """One remote account under one work dir, shared by every job that names it."""

    def __init__(self, spec: HostSpec, *, key: str | None, known_hosts: str | None, workdir: str, namespace: str,
                 tuning: Tuning, log: Any, count: Callable[[str, str, dict[str, int] | None], None],
                 account: Account | None = None) -> None:
        self.spec = spec
        #: The owner this host's connection logs in for: its key and known_hosts are read with their rights
        #: (``None``: this process's own user, who reads them itself).
        self.account = account
        self.label = spec.label
        self.key = key
        self.known_hosts = known_hosts
        # An owner's runs have a directory of their own under the work dir (made by the owner, theirs alone).
        self.base = f"{workdir.rstrip('/')}/{namespace}" + (f"-{account.name}" if account is not None else "")
        self.bindir = f"{self.base}/bin-{SCRIPTS_HASH}"
        self.events = f"{self.base}/events.log"
        self.slots = 1
        self.tuning = tuning
        self.log = log.bind(host=self.label)
        self._count = count
        self.conn: asyncssh.SSHClientConnection | None = None
        self.sftp: asyncssh.SFTPClient | None = None
        self.boot: int | None = None
        self._connect_lock = anyio.Lock()
        self._sessions = anyio.CapacityLimiter(max(1, tuning.max_sessions))
        self.failures = 0
        self.retry_at = 0.0
        #: ``time.monotonic()`` since which the host has not answered (``None``: it answers).
        self.down_since: float | None = None
        self.last_error = ""
        #: The host's events file: ``event_lines.offset`` is where the next tick's ``tail`` starts.
        self.event_lines = EventLines()
        self.runs: dict[str, Run] = {}
        #: Runs this driver answers for, key -> since when (``inf`` while their submission is under way).
        #: Only these count against ``slots``: the events file also tells of runs nobody watches any more
        #: (killed, lost, other jobs), which must not hold slots after a replay. A run stays here until it
        #: is over or killed (see :meth:`settle`), whether or not the core's status queries mention it.
        self.mine: dict[str, float] = {}
        self.queue: deque[Run] = deque()
        #: Run key -> token of the fence this driver's lookup put up for it here (see ``scripts.lookup``):
        #: the submission that sends the run again takes it down by that token.
        self.fences: dict[str, str] = {}
        #: Local input file -> (size, mtime_ns) already staged on this host.
        self.staged: dict[str, tuple[int, int]] = {}

    # ------------------------------------------------------------- accounting
    def load(self, states: frozenset[str]) -> int:
        """How many of the runs this driver answers for are in ``states``."""
        runs = self.runs
        return sum(1 for k in self.mine if (r := runs.get(k)) is not None and r.state in states)

    def settle(self, watched: set[str]) -> None:
        """Adopt the runs the core watches here; forget the ones that are over and that it no longer watches.

        Adopting is how a reopened home's runs become this driver's again. A
        status query that does not mention a run is no reason to forget it: the
        core does not watch runs whose submission has not returned yet (another
        host of the same ``submit_bulk`` may still be answering), and those must
        keep their slots and their place in the launch queue. Only an ending or
        a kill (:mod:`orch_ssh.kill`) gives a run up.
        """
        now = time.monotonic()
        for k in watched:
            self.mine.setdefault(k, now)
        runs = self.runs
        over = [k for k in self.mine if k not in watched and (r := runs.get(k)) is not None and r.state in OVER]
        for k in over:
            del self.mine[k]

    def unwatched(self, watched: set[str]) -> list[Run]:
        """Runs of this driver's that the core does not mention and that may still end (or die) silently.

        The monitoring tick checks them with the core's runs, in the same remote
        command, so that a run the core does not watch (yet, or any more) frees
        its slot when it ends. Runs whose submission is under way are left to it.
        """
        runs = self.runs
        return [r for k, t in self.mine.items() if k not in watched and t != math.inf
                and (r := runs.get(k)) is not None and r.state in (UNVERIFIED, LAUNCHED, STARTED)]

    def run(self, key: str) -> Run:
        """The run with ``key``, known or not (unknown ones start unverified)."""
        run = self.runs.get(key)
        if run is None:
            run = self.runs[key] = Run(key)
        return run

    def may_try(self) -> bool:
        """False while a failed connection attempt's backoff lasts."""
        return (self.conn is not None and not self.conn.is_closed()) or time.monotonic() >= self.retry_at

    # -------------------------------------------------------------- connection
    async def connect(self) -> asyncssh.SSHClientConnection:
        """The open connection, reconnecting (with backoff) when it is gone."""
        conn = self.conn
        if conn is not None and not conn.is_closed():
            return conn
        async with self._connect_lock:
            conn = self.conn
            if conn is not None and not conn.is_closed():
                return conn
            self._forget_connection()
            wait = self.retry_at - time.monotonic()
            if wait > 0:
                raise Unreachable(f"{self.label} is unreachable ({self.last_error}); next attempt in {wait:.1f} s")
            try:
                conn = await self._open()
            except asyncssh.HostKeyNotVerifiable as exc:
                msg = (f"host key of {self.label} is not trusted: it does not match "
                       f"{self.known_hosts or 'known_hosts'} ({exc}); refusing to connect")
                self._failed(msg)
                self.log.error("ssh host key rejected", error=msg)
                raise HostKeyRejected(msg) from None
            except AccountError as exc:  # the owner's key or known_hosts: not theirs to read
                self._failed(str(exc))
                raise Unreachable(f"cannot connect to {self.label}: {exc}") from None
            except (OSError, asyncssh.Error, TimeoutError) as exc:
                self._failed(f"{type(exc).__name__}: {exc}")
                raise Unreachable(f"cannot connect to {self.label}: {type(exc).__name__}: {exc}") from None
            try:
                await self._setup(conn)
            except (OSError, asyncssh.Error, TimeoutError, HostError) as exc:
                conn.abort()
                self._failed(f"setup failed: {exc}")
                raise Unreachable(f"cannot set up {self.label}: {exc}") from None
            self.conn = conn
            if self.down_since is not None:
                self.log.warning("ssh host reachable again", down_seconds=round(time.monotonic() - self.down_since, 1))
            self.failures, self.retry_at, self.down_since = 0, 0.0, None
            return conn

    async def _open(self) -> asyncssh.SSHClientConnection:
        self._count("connect", self.label, None)
        if self.known_hosts is None:
            self.log.warning("SSH HOST KEY CHECKING IS DISABLED (known_hosts=None): any server answering at "
                             f"{self.label} is trusted; set known_hosts to a file to check it")
        options: dict[str, Any] = {
            "username": self.spec.user, "known_hosts": self.known_hosts, "config": None,
            "connect_timeout": self.tuning.connect_timeout, "keepalive_interval": self.tuning.keepalive_interval,
            "keepalive_count_max": 3,
            # AES-GCM first: asyncssh builds a new ChaCha20 context per packet, while AES-GCM is one AES-NI
            # call; 40 % fewer function calls in a 500-run job (benchmarks/README.md). OpenSSH offers both.
            "encryption_algs": ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
                                "aes256-ctr", "aes192-ctr", "aes128-ctr"],
        }
        if self.account is not None:  # the owner's files, read with the owner's rights (never root's)
            account = self.account
            if self.known_hosts is not None:
                text = await anyio.to_thread.run_sync(read_as, account, self.known_hosts)
                options["known_hosts"] = asyncssh.import_known_hosts(text.decode(errors="replace"))
            if self.key is not None:
                data = await anyio.to_thread.run_sync(read_as, account, self.key)
                options.update(client_keys=[asyncssh.import_private_key(data)], agent_path=None)
            else:
                options.update(client_keys=[], agent_path=None)  # root's default keys are not the owner's
        elif self.key is not None:
            options.update(client_keys=[self.key], agent_path=None)
        return await asyncssh.connect(self.spec.host, self.spec.port, **options)

    async def _setup(self, conn: asyncssh.SSHClientConnection) -> None:
        """Make the remote namespace, install the wrapper if missing, learn the boot time; open SFTP."""
        out = await self._exec(conn, "setup", scripts.setup(self.base, self.bindir, tuple(SCRIPT_FILES)), None)
        lines = out.decode(errors="replace").splitlines()
        if "READY" not in lines:
            raise RemoteFailed(f"setup on {self.label} did not finish: {out[-300:]!r}")
        if "NOSETSID" in lines:
            raise RemoteFailed(f"{self.label} has no setsid command (util-linux): runs could not outlive "
                               "the connection")
        self.boot = next((boot for w in (line.split() for line in lines)
                          if len(w) == 2 and w[0] == "BOOT" and (boot := decimal(w[1])) is not None), None)
        sftp = await conn.start_sftp_client()
        if "HAVEBIN" not in lines:
            await sftp.makedirs(self.bindir, exist_ok=True)
            for name, data in SCRIPT_FILES.items():
                tmp = f"{self.bindir}/.{name}.{secrets.token_hex(4)}.tmp"  # hosts may share a file system
                async with sftp.open(tmp, "wb") as f:
                    await f.write(data)
                await sftp.chmod(tmp, 0o755)
                await sftp.posix_rename(tmp, f"{self.bindir}/{name}")
                self._count("sftp_install", self.label, None)
        self.sftp = sftp

    def _failed(self, error: str) -> None:
        """A connection attempt failed: back off before the next (doubling, capped)."""
        now = time.monotonic()
        self.failures += 1
        delay = min(self.tuning.backoff_first * 2 ** (self.failures - 1), self.tuning.backoff_max)
        self.retry_at = now + delay
        if self.down_since is None:
            self.down_since = now
            self.log.warning("ssh host unreachable", error=error)
        self.last_error = error

    def _forget_connection(self) -> None:
        if self.conn is not None:
            self.conn.abort()
        self.conn, self.sftp = None, None

    def dropped(self, error: str) -> None:
        """The connection died under us: forget it; the next use reconnects at once."""
        if self.conn is not None or self.down_since is None:
            self.log.warning("ssh connection lost", error=error)
        self._forget_connection()
        if self.down_since is None:
            self.down_since = time.monotonic()
        self.last_error = error

    async def aclose(self) -> None:
        conn, self.conn, self.sftp = self.conn, None, None
        if conn is not None:
            conn.close()
            with anyio.move_on_after(2):
                await conn.wait_closed()

    # ----------------------------------------------------------------- commands
    async def _exec(self, conn: asyncssh.SSHClientConnection, kind: str, script: str,
                    tally: dict[str, int] | None, timeout: float | None = None) -> bytes:
        self._count(kind, self.label, tally)
        try:
            async with self._sessions:
                with anyio.fail_after(timeout or self.tuning.command_timeout):
                    result = await conn.run("exec sh -s", input=script.encode(), encoding=None)
        except (asyncssh.Error, OSError, TimeoutError) as exc:
            raise Dropped(f"{kind} on {self.label}: {type(exc).__name__}: {exc}") from None
        if result.exit_status is None:
            raise Dropped(f"{kind} on {self.label}: the connection closed before the command ended")
        if result.exit_status != 0:
            err = _bytes(result.stderr).decode(errors="replace").strip()[-500:]
            raise RemoteFailed(f"{kind} on {self.label} exited with {result.exit_status}: {err}")
        return _bytes(result.stdout)

    async def command(self, kind: str, script: str, tally: dict[str, int] | None = None, *,
                      timeout: float | None = None) -> bytes:
        """Run ``script`` with ``sh -s`` on the host; its stdout. ``tally`` counts it for the tick."""
        conn = await self.connect()
        try:
            return await self._exec(conn, kind, script, tally, timeout)
        except Dropped as exc:
            self.dropped(str(exc))
            raise

    async def _sftp(self) -> asyncssh.SFTPClient:
        await self.connect()
        if self.sftp is None:
            raise Dropped(f"{self.label}: no SFTP session")
        return self.sftp

    def _sftp_error(self, what: str, exc: BaseException) -> HostError:
        if isinstance(exc, (asyncssh.SFTPNoConnection, asyncssh.SFTPConnectionLost, asyncssh.DisconnectError,
                            asyncssh.ChannelOpenError, ConnectionError, TimeoutError)) or (
                self.conn is None or self.conn.is_closed()):
            self.dropped(f"{what}: {exc}")
            return Dropped(f"{what} on {self.label}: {type(exc).__name__}: {exc}")
        return RemoteFailed(f"{what} on {self.label}: {type(exc).__name__}: {exc}")

    async def stage(self, files: list[Path]) -> dict[str, str]:
        """Upload input files not yet on this host (once per host and version); local path -> remote path."""
        remote: dict[str, str] = {}
        for path in files:
            local = str(path)
            st = path.stat()
            ident = (st.st_size, st.st_mtime_ns)
            target_dir = f"{self.base}/input/{hashlib.sha256(str(path.parent).encode()).hexdigest()[:16]}"
            target = f"{target_dir}/{path.name}"
            remote[local] = target
            if self.staged.get(local) == ident:
                continue
            sftp = await self._sftp()
            try:
                await sftp.makedirs(target_dir, exist_ok=True)
                tmp = f"{target_dir}/.{path.name}.{secrets.token_hex(4)}.tmp"
                await sftp.put(local, tmp)
                await sftp.posix_rename(tmp, target)
            except (asyncssh.Error, OSError, TimeoutError) as exc:
                raise self._sftp_error(f"staging {path.name}", exc) from None
            self._count("sftp_stage", self.label, None)
            self.staged[local] = ident
        return remote

    async def fetch(self, remote_dir: str, local_dir: Path, *, create: bool = True, kind: str = "sftp_get") -> bool:
        """Copy a remote dir's contents into ``local_dir``; ``False`` if the remote dir is missing.

        ``create=False``: make ``local_dir`` only if the remote dir has something to put in it.
        """
        sftp = await self._sftp()
        if create:
            local_dir.mkdir(parents=True, exist_ok=True)
        self._count(kind, self.label, None)
        try:
            names = [n for n in await sftp.listdir(remote_dir) if n not in (".", "..")]
            if names:
                local_dir.mkdir(parents=True, exist_ok=True)
                await sftp.get([f"{remote_dir}/{n}" for n in names], str(local_dir), recurse=True, preserve=False)
                if self.account is not None:  # what came back of an owner's run is the owner's, as the run was
                    await anyio.to_thread.run_sync(_give_tree, self.account, local_dir, names)
        except asyncssh.SFTPNoSuchFile:
            return False
        except (asyncssh.Error, OSError, TimeoutError) as exc:
            raise self._sftp_error("fetching output", exc) from None
        return True

    async def upload_dir(self, local_dir: Path, remote_parent: str) -> None:
        """Copy ``local_dir`` (a run's starting state) into ``remote_parent`` on the host."""
        sftp = await self._sftp()
        try:
            await sftp.makedirs(remote_parent, exist_ok=True)
            await sftp.put(str(local_dir), remote_parent, recurse=True, preserve=False)
        except (asyncssh.Error, OSError, TimeoutError) as exc:
            raise self._sftp_error(f"uploading {local_dir.name}", exc) from None
        self._count("sftp_state", self.label, None)

    async def read_small(self, path: str) -> bytes | None:
        """A small remote file's bytes, or ``None`` if it does not exist."""
        sftp = await self._sftp()
        try:
            async with sftp.open(path, "rb") as f:
                data = await f.read(4096)
        except asyncssh.SFTPNoSuchFile:
            return None
        except (asyncssh.Error, OSError, TimeoutError) as exc:
            raise self._sftp_error(f"reading {path}", exc) from None
        return data if isinstance(data, bytes) else data.encode()

    # ------------------------------------------------------------------ events
    def feed(self, data: bytes) -> None:
        """Apply the events file's bytes that follow ``event_lines.offset`` (a partial last line waits for the rest)."""
        for parts in self.event_lines.feed(data):
            key, word, value = parts[0], parts[1], parts[2]
            run = self.run(key)
            if word == "INTENT":
                run.advance(LAUNCHED)
            elif word in ("LAUNCH", "START"):
                if (pid := event_pid(value)) is not None and run.state not in (ENDED, LOST, KILLED):
                    run.pid = pid
                run.advance(STARTED if word == "START" else LAUNCHED)
            elif word == "END":
                run.code = decimal(value)
                run.advance(ENDED)
            elif word == "CANCEL":
                run.reason = run.reason or "cancelled before it started"
                run.advance(KILLED)


def _give_tree(account: Account, local_dir: Path, names: list[str]) -> None:
    """``local_dir`` and the fetched ``names`` in it, with everything below them, made ``account``'s."""
    give(account, local_dir)
    for name in names:
        top = local_dir / name
        give(account, top)
        if top.is_dir() and not top.is_symlink():
            for root, dirs, files in os.walk(top):
                give(account, *(os.path.join(root, n) for n in (*dirs, *files)))
