"""Processes on this machine: start one detached, learn of its end when it happens, find it again by name.

For backends whose runs are processes here (``local``). :func:`spawn_detached`
is one ``posix_spawn`` (a vfork and an exec: no pipe, no thread, no child
watcher); :class:`ExitWatcher` holds a pidfd per process in one epoll that
the event loop waits on, so a thousand running processes cost nothing until
one ends, and a process the driver did not start itself (one it found again
after a restart) is watched the same way. Where pidfds are missing (not
Linux, a kernel before 5.3, more processes than the descriptors it may take)
``watch`` says so and the driver looks at the process now and then instead
(:func:`pid_alive`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import resource
import select
import signal
import sys
from collections.abc import Mapping, Sequence

import anyio

from .wrapper import SpawnError, env_entry, pid_alive

#: Signals Python ignores, which a child would inherit ignored: a run gets them back at their defaults.
RESTORED = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ") if hasattr(signal, name))


class _LibcSpawn:
    """``posix_spawn(3)`` called through ``ctypes``, which lets go of the interpreter lock for the call.

    A ``posix_spawn`` returns once its child has exec'd; on a busy machine the child waits for a CPU first, a
    millisecond or more. ``os.posix_spawn`` holds the interpreter lock all that time (so the event loop stops);
    through ``ctypes`` other threads, and the loop, go on meanwhile, and several threads start processes at once.
    """

    #: POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSID (the last since glibc 2.26, musl 1.1.23).
    FLAGS = 0x04 | 0x08 | 0x80
    #: Bytes for the opaque ``posix_spawnattr_t``, ``posix_spawn_file_actions_t`` and ``sigset_t`` (336, 80 and 128
    #: on glibc x86-64).
    OPAQUE = 1024

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.spawn, self.init_attr, self.destroy_attr = libc.posix_spawn, libc.posix_spawnattr_init, \
            libc.posix_spawnattr_destroy
        self.set_flags, self.init_actions, self.destroy_actions = libc.posix_spawnattr_setflags, \
            libc.posix_spawn_file_actions_init, libc.posix_spawn_file_actions_destroy
        self.add_open, self.add_dup2 = libc.posix_spawn_file_actions_addopen, libc.posix_spawn_file_actions_adddup2
        self.set_default, self.set_mask = libc.posix_spawnattr_setsigdefault, libc.posix_spawnattr_setsigmask
        self.set_flags.argtypes = [ctypes.c_void_p, ctypes.c_short]
        # Signals this interpreter ignores (as ``subprocess`` restores them), set to their defaults; none blocked.
        self.defaults, self.no_mask = ctypes.create_string_buffer(self.OPAQUE), ctypes.create_string_buffer(self.OPAQUE)
        if libc.sigemptyset(self.defaults) or libc.sigemptyset(self.no_mask) or any(
                libc.sigaddset(self.defaults, int(sig)) for sig in RESTORED):
            raise OSError(errno.EINVAL, "sigset")
        self.add_open.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint]
        self.add_dup2.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        # Every descriptor past the three closed in the child (glibc 2.34+): one this process holds without
        # close-on-exec (inherited from whoever started it: a supervisor's pipe) is not a run's to have.
        self.add_closefrom = getattr(libc, "posix_spawn_file_actions_addclosefrom_np", None)
        if self.add_closefrom is not None:
            self.add_closefrom.argtypes = [ctypes.c_void_p, ctypes.c_int]

    def __call__(self, argv: list[str], env: Mapping[str, str] | Sequence[bytes], out: int) -> int:
        c_argv = (ctypes.c_char_p * (len(argv) + 1))(*[os.fsencode(a) for a in argv], None)
        c_env = (ctypes.c_char_p * (len(env) + 1))(*_entries(env), None)
        attr, actions = ctypes.create_string_buffer(self.OPAQUE), ctypes.create_string_buffer(self.OPAQUE)
        pid = ctypes.c_int()
        if self.init_attr(attr) or self.init_actions(actions):
            raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))
        try:
            if (self.set_flags(attr, self.FLAGS) or self.set_default(attr, self.defaults)
                    or self.set_mask(attr, self.no_mask) or self.add_open(actions, 0, b"/dev/null", os.O_RDONLY, 0)
                    or self.add_dup2(actions, out, 1) or self.add_dup2(actions, out, 2)
                    or (self.add_closefrom is not None and self.add_closefrom(actions, 3))):
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            error = self.spawn(ctypes.byref(pid), c_argv[0], actions, attr, c_argv, c_env)
        finally:
            self.destroy_actions(actions)
            self.destroy_attr(attr)
        if error:
            raise OSError(error, os.strerror(error))
        return pid.value


def _entries(env: Mapping[str, str] | Sequence[bytes]) -> Sequence[bytes]:
    """``env`` as ``NAME=value`` entries (given so already: :class:`~.wrapper.BaseEnviron`)."""
    if isinstance(env, Mapping):
        return [env_entry(k, v) for k, v in env.items()]
    return env


def _libc_spawn() -> _LibcSpawn | None:
    if sys.platform != "linux":
        return None
    try:
        return _LibcSpawn()
    except (OSError, AttributeError):  # no C library to load, or one without posix_spawn's parts
        return None


_spawn = _libc_spawn()


def spawn_detached(argv: list[str], env: Mapping[str, str] | Sequence[bytes], *, out: int) -> int:
    """Start ``argv`` with ``env`` (variables by name, or encoded ``NAME=value`` entries) in a session of its own,
    stdin ``/dev/null``, stdout and stderr on the open file ``out``, no other descriptor of this process (where
    the C library closes them in the child: glibc 2.34+), no signal blocked and SIGPIPE and SIGXFSZ at
    their defaults (as a shell would have them); its pid.
    Leading its own session, it outlives the process that started it, and killing its process group ends
    everything it started. Safe to call from worker threads, several at once: the call lets go of the
    interpreter lock (:class:`_LibcSpawn`) where it can. Raises :class:`SpawnError` (the message names the
    program) if it cannot be started."""
    try:
        if _spawn is not None:
            return _spawn(argv, env, out)
        named = env if isinstance(env, Mapping) else dict(e.split(b"=", 1) for e in env)
        return os.posix_spawn(argv[0], argv, named, setsid=True, setsigdef=RESTORED, setsigmask=(),
                              file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                            (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)])
    except OSError as exc:
        raise SpawnError(f"could not start the wrapper with {argv[0]}: {exc.strerror}") from exc


def reap(pid: int) -> int | None:
    """Collect ``pid`` if it is an exited child of this process: its exit code (``-N`` for signal N), else
    ``None`` (still running, or not a child of this process: someone else collects it)."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status) if done else None


def process_args(pid: int) -> list[bytes]:
    """The command line of ``pid`` (empty when it is gone or not ours to read)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def process_environ(pid: int) -> list[bytes]:
    """The environment ``pid`` started with, as ``NAME=value`` entries (empty when it is gone or not ours to read):
    a program started without a wrapper carries no key in its arguments, and is known by it after a crash."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def find_process(needle: str) -> int | None:
    """The pid of a live process with ``needle`` as one of its arguments (a run's key), if any."""
    want = os.fsencode(needle)
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and want in process_args(int(entry.name)) and pid_alive(int(entry.name)):
                return int(entry.name)
    return None


class ExitWatcher:
    """The processes being watched for their end; see the module docstring. One task awaits :meth:`ended`."""

    def __init__(self, limit: int | None = None) -> None:
        self._epoll: select.epoll | None = None
        if hasattr(os, "pidfd_open") and hasattr(select, "epoll"):
            self._epoll = select.epoll()
        #: Most pidfds held at once: half of this process's descriptors, less a reserve, by default (the rest of
        #: the process needs its files and sockets; processes past the limit are looked at now and then instead).
        self.limit = limit if limit is not None else max(0, resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2 - 64)
        self._fd_of: dict[int, int] = {}
        self._pid_of: dict[int, int] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._fd_of)

    def watch(self, pid: int) -> bool:
        """Be told when ``pid`` ends. ``False``: it cannot be watched (it is gone already, or no pidfd can be had
        here): look at it now and then instead."""
        if self._epoll is None or len(self._fd_of) >= self.limit:
            return False
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone (ESRCH), no pidfds in this kernel (ENOSYS), no descriptor left (EMFILE)
            return False
        self._epoll.register(fd, select.EPOLLIN)
        self._fd_of[pid], self._pid_of[fd] = fd, pid
        return True

    def _close(self, fd: int) -> None:
        self._pid_of.pop(fd, None)
        if self._epoll is not None:
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)
        os.close(fd)

    def ready(self) -> list[int]:
        """The watched processes that have ended (they are watched no more)."""
        if self._epoll is None or not self._fd_of:
            return []
        ended = []
        for fd, _ in self._epoll.poll(0):
            pid = self._pid_of.get(fd)
            if pid is not None:
                ended.append(pid)
                del self._fd_of[pid]
                self._close(fd)
        return ended

    async def ended(self) -> list[int]:
        """Wait until a watched process ends; those that did. Raises ``anyio.ClosedResourceError`` once
        :meth:`close` was called (the waiting task then stops)."""
        if self._closed:
            raise anyio.ClosedResourceError
        if self._epoll is None:
            await anyio.sleep_forever()
        while True:
            pids = self.ready()
            if pids:
                return pids
            if self._epoll is None:  # closed while this task was about to wake from its wait
                raise anyio.ClosedResourceError
            await anyio.wait_readable(self._epoll.fileno())

    def close(self) -> None:
        """Stop watching: a task waiting in :meth:`ended` is woken with ``ClosedResourceError``."""
        self._closed = True
        for fd in list(self._pid_of):
            self._close(fd)
        self._fd_of.clear()
        if self._epoll is not None:
            anyio.notify_closing(self._epoll.fileno())
            self._epoll.close()
            self._epoll = None


__all__ = ["ExitWatcher", "find_process", "process_args", "process_environ", "reap", "spawn_detached"]
