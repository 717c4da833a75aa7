"""The driver's side of its launcher (:mod:`.launcher`): runs started by one long-lived process of the home instead
of a ``sh wrapper.sh`` each.

The launcher listens on ``launcher.sock`` in the driver's state dir (mode 0600, in a dir of the orchestrator's
own; each side checks the other is of its user too). The driver starts one when it first needs it, and finds the
one an earlier process left: a launcher outlives the orchestrator, as wrappers do, and tells a new connection
first which runs it has. A run is hosted when nothing of the wrapper's shell is asked of it: the orchestrator's
own user runs it (an owner's run starts under ``setpriv``, through the wrapper), with the default shell, no
declared output files, and a program, not a shell built-in.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import anyio

from orchestrator.plugin import RunSpec
from orchestrator.plugin.users import OwnerError, identity

from .launcher import frame, frames

#: Names ``sh`` would take as its own built-ins, not programs: a run of one of them keeps the wrapper.
SHELL_BUILTINS = frozenset((".", ":", "[", "alias", "bg", "break", "cd", "chdir", "command", "continue", "echo", "eval",
                            "exec", "exit", "export", "false", "fc", "fg", "getopts", "hash", "jobs", "kill", "local",
                            "printf", "pwd", "read", "readonly", "return", "set", "shift", "test", "times", "trap",
                            "true", "type", "ulimit", "umask", "unalias", "unset", "wait"))
#: Seconds a found launcher has to tell its runs; one that did not is asked again only after :data:`ASK_AGAIN_AFTER`
#: (its runs start through the wrapper meanwhile).
HELLO_WITHIN = 5.0
ASK_AGAIN_AFTER = 30.0
_PEERCRED = struct.Struct("3i")


def hostable(spec: RunSpec) -> bool:
    """Whether ``spec`` can be started by the launcher, the wrapper's shell doing nothing it alone could: the
    orchestrator's own user's run (another owner's starts under ``setpriv``, through the wrapper)."""
    if "shell" in spec.settings or spec.outputfiles or ("/" not in spec.executable
                                                         and spec.executable in SHELL_BUILTINS):
        return False
    try:
        return identity(spec.owner) is None
    except OwnerError:  # told when it is started, through the wrapper
        return False


def start_frame(spec: RunSpec, bindir: str, base: bytes, own: Sequence[bytes]) -> bytes:
    """The launcher's ``S`` message: the run's program, its dirs, and its environment as the base named ``base``
    (:meth:`Launcher.base_token`) and its own entries over it."""
    argv = [os.fsencode(a) for a in (spec.executable, *spec.args)]
    return frame(b"S", spec.key.encode(), str(spec.attempt).encode(), os.fsencode(spec.outputdir),
                 os.fsencode(spec.workdir), os.fsencode(bindir), base, str(len(argv)).encode(), *argv, *own)


class Launcher:
    """A connection to the home's launcher (made, or found, by :meth:`connect`)."""

    def __init__(self, statedir: Path, events: Path, out: int, *, most: int = 0) -> None:
        self.statedir, self.events, self.out = statedir, events, out
        #: At most this many of the runs sent run at once (the launcher keeps the others waiting): ``M``.
        self.most = most
        #: What a new connection says first (``M``), with its first message.
        self._hello = b""
        #: Until when a launcher that did not answer in time is not asked again.
        self._silent_until = 0.0
        self.sock: socket.socket | None = None
        #: The runs the launcher has, by key (what it told: ``R``, ``L``, ``E``); pid 0 for one waiting its turn.
        self.runs: dict[str, int] = {}
        #: Intermediate processes of launchers started (each forks the launcher and ends): the driver reaps them.
        self.spawned: list[int] = []
        self._inbox = bytearray()
        self._early: list[list[bytes]] = []
        #: The event loop the connection is watched by (a reader kept registered for as long as it lasts), and what
        #: its callback tells :meth:`receive`: something came, or the launcher has ended.
        self._watched_by: asyncio.AbstractEventLoop | None = None
        self._came = asyncio.Event()
        self._ended = False
        #: Set while connected (what waits for the launcher's word waits for this between two launchers).
        self.connected = anyio.Event()
        #: The orchestrator's environment as last named to the launcher (``B``), by the object that holds it
        #: (:meth:`~orchestrator.plugin.wrapper.BaseEnviron.entries` gives the same one until it changes).
        self._base: tuple[object, bytes] | None = None
        self._base_count = 0
        self._unsent_base = b""

    def _address(self) -> tuple[str, int | None]:
        """The socket's path, short enough for ``sun_path`` (through the state dir's descriptor when it is not)."""
        path = str(self.statedir / "launcher.sock")
        if len(os.fsencode(path)) < 100:
            return path, None
        fd = os.open(self.statedir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        return f"/proc/self/fd/{fd}/launcher.sock", fd

    def connect(self, *, start: bool) -> bool:
        """Connected to the home's launcher: the one running (its runs learnt), or, with ``start``, a new one."""
        if self.sock is not None:
            return True
        if time.monotonic() < self._silent_until:
            return False
        address, dirfd = self._address()
        try:
            found = self._found(address)
            if found is None:  # one is there, slow to answer: none is started beside it (its runs would be
                self._silent_until = time.monotonic() + ASK_AGAIN_AFTER  # taken for never started, and started
                return False  # twice)
            if found or not start:
                return found
            return self._start(address)
        finally:
            if dirfd is not None:
                os.close(dirfd)

    def _found(self, address: str) -> bool | None:
        """Connected to the launcher listening at ``address``; ``None`` when one is there but has not told its runs
        within :data:`HELLO_WITHIN` (the caller starts no other: the next call asks again)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.connect(address)
            if not _same_user(sock):
                raise OSError(f"{address} is another user's")
            sock.settimeout(HELLO_WITHIN)
            while not (batch := frames(self._inbox)):
                data = sock.recv(1 << 16)
                if not data:
                    raise OSError("the launcher ended")
                self._inbox += data
        except OSError as exc:
            sock.close()
            self._inbox.clear()
            return None if isinstance(exc, TimeoutError) else False
        sock.settimeout(None)
        self._connected(sock, self._apply(batch))  # its runs known at once (a restart adopts them before any await)
        return True

    def _start(self, address: str) -> bool:
        path = self.statedir / "launcher.sock"
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a launcher's that ended (none answered there)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            listener.bind(address)
            os.chmod(path, 0o600)
            listener.listen(64)
            program = str(Path(__file__).with_name("launcher.py"))
            self.spawned.append(os.posix_spawn(
                sys.executable, [sys.executable, "-I", "-S", program, str(self.events)], os.environ,
                file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0), (os.POSIX_SPAWN_DUP2, self.out, 1),
                              (os.POSIX_SPAWN_DUP2, self.out, 2), (os.POSIX_SPAWN_DUP2, listener.fileno(), 3)],
                setsid=True))
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            sock.connect(address)  # waits in the listener's backlog until the launcher takes it
        except OSError:
            return False
        finally:
            listener.close()
        self._connected(sock, [])
        return True

    def _connected(self, sock: socket.socket, early: list[list[bytes]]) -> None:
        """``sock`` is the connection from now on: its first message says ``M``, the environment is named again on
        it (a ``B`` still unsent goes too: messages made for it may be on their way)."""
        self.sock = sock
        self._ended = False
        self._early = early
        self._base = None
        self._hello = frame(b"M", b"%d" % self.most)
        self.connected.set()

    def base_token(self, base: Mapping[str, bytes]) -> bytes:
        """The name under which the launcher knows ``base`` (the entries every run shares: sent once, in a ``B``
        message ahead of the next :meth:`send`, and not with each run)."""
        if self._base is None or self._base[0] is not base:
            self._base_count += 1
            token = b"%d.%d" % (os.getpid(), self._base_count)  # never another driver's, on a launcher they share
            self._base = (base, token)
            self._unsent_base = frame(b"B", token, *(v for k, v in base.items() if k != "PWD"))
        return self._base[1]

    def kill(self, key: str, grace: float) -> bool:
        """SIGTERM to the run's process group, by the launcher (which then records its end as a stop), and SIGKILL
        ``grace`` seconds later if it still runs, whether an orchestrator is left or not; False when the launcher
        is gone (the caller signals the group itself)."""
        return self.send(frame(b"K", key.encode(), b"%.3f" % grace))

    def withdraw(self, key: str) -> bool:
        """The run dropped if it still waits at the launcher (never started); one started goes on."""
        return self.send(frame(b"D", key.encode()))

    def send(self, data: bytes) -> bool:
        """One message (or several), after what the launcher must hear first (``M``, ``B``); False when the launcher
        is gone (the connection is dropped)."""
        if self.sock is None:
            return False
        try:
            self.sock.sendall(self._hello + self._unsent_base + data)
            self._hello = self._unsent_base = b""
            return True
        except OSError:
            self.drop()
            return False

    async def receive(self) -> list[list[bytes]] | None:
        """The next messages from the launcher; ``None`` once it has ended (the connection dropped).

        The socket is watched by a reader registered once per connection (:meth:`_readable`), not by a
        ``wait_readable`` a message: that added and removed the socket from the loop's epoll set each time, two
        system calls and a future a run (``benchmarks/README.md``, issue 26)."""
        if self._early:
            batch, self._early = self._early, []
            return self._apply(batch)
        while self.sock is not None:
            if self._watched_by is None:
                self._watched_by, self._came = asyncio.get_running_loop(), asyncio.Event()
                self._watched_by.add_reader(self.sock.fileno(), self._readable)
            if batch := frames(self._inbox):
                return self._apply(batch)
            if self._ended:
                self.drop()
                return None
            self._came.clear()
            await self._came.wait()
        return None

    def _readable(self) -> None:
        """The loop's callback: what the launcher sent, taken into the inbox (at most 64 KiB a call: a mebibyte
        buffer costs a mmap a call); its end noted, and the socket no longer watched."""
        if self.sock is None:
            return
        try:
            data = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._inbox += data
        else:
            self._ended = True
            self._unwatch()
        self._came.set()

    def _unwatch(self) -> None:
        if self._watched_by is not None and self.sock is not None:
            with contextlib.suppress(RuntimeError, ValueError, OSError):  # (a loop closed meanwhile)
                self._watched_by.remove_reader(self.sock.fileno())
        self._watched_by = None

    def _apply(self, batch: list[list[bytes]]) -> list[list[bytes]]:
        for fields in batch:
            if fields[0] == b"R":
                pairs = fields[1:]
                self.runs.update((pairs[i].decode(), int(pairs[i + 1])) for i in range(0, len(pairs) - 1, 2))
            elif fields[0] == b"L":
                self.runs[fields[1].decode()] = int(fields[2])
            elif fields[0] == b"E":
                self.runs.pop(fields[1].decode(), None)
        return batch

    def reap(self, *, wait: bool = False) -> None:
        """Collect the launchers' intermediate processes that have ended (``wait``: all of them)."""
        for pid in list(self.spawned):
            try:
                done, _ = os.waitpid(pid, 0 if wait else os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.spawned.remove(pid)

    def drop(self) -> None:
        if self.connected.is_set():
            self.connected = anyio.Event()
        if self.sock is not None:
            self._unwatch()
            self.sock.close()
            self.sock = None
            self._inbox.clear()
            self.runs.clear()
        self._ended = False
        self._came.set()  # a task waiting in receive() is woken: it finds no connection


def _same_user(sock: socket.socket) -> bool:
    _, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return bool(uid == os.getuid())
