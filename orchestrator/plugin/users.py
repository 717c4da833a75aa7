"""Acting for a run's owner: who they are (uid, gid, groups), and doing things on this machine as them.

A multi-user service runs as root and does everything for a user with that
user's ids (``docs/reference.md``, "Running work as its owner"). A run whose
owner is the orchestrator's own user (or ``None``) needs nothing of this: it
goes the single-user way, as fast as ever (:func:`identity` answers ``None``).

- :func:`identity`: the owner's ids, ``None`` for the orchestrator's own user;
  :class:`OwnerError` when the run cannot be run as its owner (no such user,
  or this process cannot switch users).
- :func:`switch_argv`: ``setpriv`` arguments that put a command under the
  owner's ids (``os.posix_spawn`` cannot switch users itself).
- :func:`run_as`: a command as the owner (read a file, copy one in, a postprocessor), of its output only
  the last bytes kept (:data:`OUTPUT_KEPT`).
- :func:`python_for`: a Python the owner may run, with this installation's
  packages, for work that must run in Python as the owner (user-named
  postprocessors).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import functools
import os
import pwd
import selectors
import shutil
import stat
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from .accounts import Account


class OwnerError(Exception):
    """The run cannot be run as its owner; the message is ready to serve as its reason."""


@dataclass(frozen=True, slots=True)
class Identity(Account):
    """An OS user's ids, as a run of theirs gets them: the :class:`~.accounts.Account` a plugin acts as, and
    the login shell the orchestrator's own runs start under."""

    shell: str

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with the owner's ``HOME``, ``USER`` and ``LOGNAME`` (never the service's)."""
        return {**env, "HOME": self.home, "USER": self.name, "LOGNAME": self.name}


@functools.lru_cache(maxsize=1)
def _self_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def can_switch() -> bool:
    """Whether this process may take other users' ids: root, or CAP_SETUID and CAP_SETGID (effective)."""
    if os.geteuid() == 0:
        return True
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    caps = int(line.split()[1], 16)
                    return bool(caps & (1 << 6)) and bool(caps & (1 << 7))  # CAP_SETGID (6), CAP_SETUID (7)
    except (OSError, ValueError):
        pass
    return False


@functools.lru_cache(maxsize=256)
def lookup(name: str) -> Identity:
    """The ids of OS user ``name`` (:class:`OwnerError` if there is no such user)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise OwnerError(f"owner {name!r} is not a user of this system") from None
    try:
        groups = tuple(sorted(set(os.getgrouplist(name, entry.pw_gid))))
    except OSError:
        groups = (entry.pw_gid,)
    return Identity(name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir or "/", entry.pw_shell or "/bin/sh")


def identity(owner: str | None) -> Identity | None:
    """The ids to run ``owner``'s work with; ``None`` when it is the orchestrator's own user (nothing to switch)."""
    if owner is None or owner == _self_name():
        return None
    found = lookup(owner)
    if found.uid == os.getuid():
        return None
    if not can_switch():
        raise OwnerError(f"cannot run as owner {owner!r}: this orchestrator runs as {_self_name()}, not as root")
    return found


@functools.lru_cache(maxsize=1)
def setpriv() -> str:
    found = shutil.which("setpriv") or ("/usr/bin/setpriv" if os.path.exists("/usr/bin/setpriv") else None)
    if found is None:
        raise OwnerError("cannot run as the owner: setpriv (util-linux) is not installed")
    return found


def switch_argv(who: Identity) -> list[str]:
    """``setpriv`` taking ``who``'s uid, gid and groups, then exec'ing what follows (no shell: nothing quoted)."""
    groups = ",".join(map(str, who.groups))
    return [setpriv(), f"--reuid={who.uid}", f"--regid={who.gid}",
            f"--groups={groups}" if groups else "--clear-groups", "--"]


#: The most of a process's stdout and of its stderr :func:`run_as` keeps, by default: their last bytes. The process
#: is the owner's, and may print without end; what it printed was kept whole, in the memory of a service that is
#: everyone's.
OUTPUT_KEPT = 1 << 20


def run_as(who: Identity, argv: Sequence[str], *, timeout: float | None = 60.0, input: bytes | None = None,
           most_out: int = OUTPUT_KEPT, most_err: int = OUTPUT_KEPT) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` (no shell) as ``who``; stdin ``input`` or ``/dev/null``; of its stdout and its stderr the last
    ``most_out`` and ``most_err`` bytes kept (read as they come: never more than that held). Past ``timeout`` it
    is killed and ``subprocess.TimeoutExpired`` raised, as ``subprocess.run`` does."""
    with subprocess.Popen(list(argv), stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=owner_environ(who), cwd="/",
                          user=who.uid, group=who.gid, extra_groups=list(who.groups)) as proc:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            out, err = _tails(proc, input, deadline, most_out, most_err)
            code = proc.wait(None if deadline is None else max(deadline - time.monotonic(), 0.0))
        except BaseException:
            proc.kill()
            raise
        return subprocess.CompletedProcess(list(argv), code, out, err)


def _tails(proc: subprocess.Popen[bytes], given: bytes | None, deadline: float | None, most_out: int,
           most_err: int) -> tuple[bytes, bytes]:
    """``given`` written to ``proc``'s stdin while its stdout and stderr are read, both to their end (by the
    monotonic ``deadline``); the last ``most_out`` and ``most_err`` bytes of them."""
    assert proc.stdout is not None and proc.stderr is not None
    kept = {proc.stdout.fileno(): (bytearray(), most_out), proc.stderr.fileno(): (bytearray(), most_err)}
    left = memoryview(given or b"")
    with selectors.DefaultSelector() as sel:
        for fd in kept:
            sel.register(fd, selectors.EVENT_READ)
        stdin = proc.stdin.fileno() if proc.stdin is not None else -1
        if proc.stdin is not None:
            os.set_blocking(stdin, False)
            sel.register(stdin, selectors.EVENT_WRITE)
        while sel.get_map():
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0.0)
            for key, _ in sel.select(wait):
                fd = key.fd
                if fd == stdin:
                    try:
                        left = left[os.write(fd, left[:1 << 16]):]
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # it reads no more of it: as subprocess.run, not an error
                        left = left[:0]
                    if not left and proc.stdin is not None:
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    sel.unregister(fd)
                    continue
                buffer, most = kept[fd]
                buffer += chunk
                if len(buffer) > most:
                    del buffer[:len(buffer) - most]  # (from the front: CPython moves no bytes for that)
    return bytes(kept[proc.stdout.fileno()][0]), bytes(kept[proc.stderr.fileno()][0])


def owner_environ(who: Identity) -> dict[str, str]:
    """The environment a process run as ``who`` gets: a plain ``PATH`` and ``LANG``, their ``HOME`` and names."""
    return who.env(_plain_env())


def _plain_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "LANG": "C.UTF-8"}


class _FsIds:
    """``setfsuid(2)`` and ``setfsgid(2)``: the ids a thread's file system accesses are checked with (Linux)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.setfsuid, self.setfsgid = libc.setfsuid, libc.setfsgid
        for f in (self.setfsuid, self.setfsgid):
            f.argtypes, f.restype = [ctypes.c_uint], ctypes.c_int


@functools.lru_cache(maxsize=1)
def _fs_ids() -> _FsIds:
    try:
        return _FsIds()
    except (OSError, AttributeError) as exc:
        raise OwnerError(f"cannot act as another user here: {exc}") from None


@contextlib.contextmanager
def fs_as(who: Identity) -> Iterator[None]:
    """In this thread only, touch files as ``who``: every access checked with their uid and gid (the
    orchestrator's file capabilities dropped meanwhile), every file made theirs. For files the orchestrator
    makes in a directory of the owner's (a link there leads nowhere the owner could not go). The other threads
    go on as before; the ids are restored on the way out."""
    ids = _fs_ids()
    old_gid = ids.setfsgid(who.gid)
    old_uid = ids.setfsuid(who.uid)
    try:
        if ids.setfsuid(0xFFFFFFFF) != who.uid or ids.setfsgid(0xFFFFFFFF) != who.gid:  # -1: asks, changes nothing
            raise OwnerError(f"cannot act as owner {who.name}: the file system ids were not taken")
        yield
    finally:
        ids.setfsuid(old_uid)
        ids.setfsgid(old_gid)


#: A command as the owner that reads a file (``"$1"``, then its arguments) only if it is a regular one: a FIFO
#: would block its reader until someone opened it to write, and the service's reader was kept waiting (a worker
#: thread, a slot of long work) for as long as its timeout, once per file, as often as the owner asked. Exit 3:
#: it is something else (checked as the owner: they learn nothing of what they may not see).
_REGULAR_ONLY = ('path=$1; shift; if [ -e "$path" ] && [ ! -f "$path" ]; then '
                 'echo "$path is not a regular file" >&2; exit 3; fi; exec "$@"')
NOT_REGULAR = 3


def _regular_only(path: Path, argv: Sequence[str]) -> list[str]:
    return ["/bin/sh", "-c", _REGULAR_ONLY, "sh", str(path), *argv]


async def run_as_waited(who: Identity, argv: Sequence[str], *, timeout: float = 60.0
                        ) -> subprocess.CompletedProcess[bytes]:
    """A short command (no shell) as ``who``, waited for on the event loop, not in a worker thread: the worker
    threads are every user's, and the owner's files may keep it waiting (a hung mount, a file swapped for a FIFO
    as it is read). Past ``timeout`` it is killed: ``TimeoutError``."""
    with anyio.fail_after(timeout):
        return await anyio.run_process(list(argv), check=False, stdin=subprocess.DEVNULL, env=owner_environ(who),
                                       cwd="/", user=who.uid, group=who.gid, extra_groups=list(who.groups))


async def readable_by(who: Identity, path: Path) -> str | None:
    """Why ``who`` cannot read ``path`` (checked by opening it as them, a regular file only), or ``None`` when
    they can."""
    done = await run_as_waited(who, _regular_only(path, ["/usr/bin/env", "head", "-c", "0", "--", str(path)]))
    if done.returncode == 0:
        return None
    said = done.stderr.decode(errors="replace").strip().splitlines()
    if done.returncode == NOT_REGULAR:
        return "not a regular file"
    return said[-1].split(": ", 1)[-1] if said else f"exit code {done.returncode}"


async def copy_as(who: Identity, source: Path, target: Path) -> None:
    """Copy ``source`` (a regular file) to ``target`` as ``who`` (read with their rights, the copy theirs);
    ``OSError`` says why not."""
    done = await run_as_waited(who, _regular_only(source, ["/usr/bin/env", "cp", "--preserve=mode,timestamps",
                                                           "--", str(source), str(target)]))
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise OSError(said[-1] if said else f"cp failed with exit code {done.returncode}")


def read_tail_as(who: Identity, path: Path, most: int) -> bytes:
    """The last ``most`` bytes of ``path``, read as ``who``: ``FileNotFoundError`` when there is no such file,
    ``PermissionError`` when they may not read it, or it is no regular file."""
    done = run_as(who, _regular_only(path, ["/usr/bin/env", "tail", "-c", str(most), "--", str(path)]),
                  most_out=most)
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace")
        if done.returncode == NOT_REGULAR:
            raise PermissionError(f"{path.name} is not a regular file")
        if "No such file" in said:
            raise FileNotFoundError(str(path))
        raise PermissionError(f"user {who.name} may not read {path.name}")
    return done.stdout


#: How a directory is opened to learn where it really is: for its path only (no read permission needed).
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | getattr(os, "O_PATH", 0)


def _real(fd: int, path: Path) -> str:
    """Where the open directory ``fd`` (opened as ``path``) really is: what the kernel says of it (one
    ``readlink`` of ``/proc/self/fd``), else ``realpath`` (an ``lstat`` per part of the path)."""
    try:
        where = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)
    return where if where.startswith("/") and not where.endswith(" (deleted)") else os.path.realpath(path)


def real_path(path: Path) -> str:
    """``path`` with every link followed (as :func:`os.path.realpath`, in two system calls where ``/proc``
    says)."""
    try:
        fd = os.open(path, _DIRECTORY)
    except OSError:
        return os.path.realpath(path)
    try:
        return _real(fd, path)
    finally:
        os.close(fd)


@functools.lru_cache(maxsize=4096)
def _real_base(base: Path) -> str:
    """Where a base :func:`read_inside` was given really is. A base is a job's own dir, which only the orchestrator
    may replace (its parent is the orchestrator's), so where it is does not change: looked up once, not twice a
    run."""
    return real_path(base)


#: The most :func:`read_inside` reads of a file read whole: a run's files are its to make, and a sparse log of 50 GB
#: read whole took the service's memory. A file over it is not read (``EFBIG``).
READ_LIMIT = 16 << 20


def _open_inside(path: Path, base: Path) -> int:
    """``path``'s directory, open, once it is found inside ``base`` (every link on the way followed)."""
    directory = os.open(path.parent, _DIRECTORY)
    real, within = _real(directory, path.parent), _real_base(base)
    if not (real + os.sep).startswith(within + os.sep) and real != within:
        os.close(directory)
        raise PermissionError(f"{path.name} leads out of {base}")
    return directory


def read_inside(path: Path, base: Path, most: int | None = None, *, limit: int = READ_LIMIT,
                rename_to: str | None = None, head: int = 0) -> bytes:
    """The bytes of ``path`` (its last ``most``), a regular file that lies inside ``base`` once every link on the
    way is followed, itself no link: how the orchestrator reads what a run wrote (a run's owner may have made
    its files links to files only the orchestrator may read). ``FileNotFoundError`` when it is missing;
    ``PermissionError`` when it leads out of ``base``, is no regular file, or is a hard link to a file of another
    user than the directory's; ``OSError`` (``EFBIG``) when it is read whole (no ``most``) and is over ``limit``
    bytes. Never more than that is read, whatever the file grows to meanwhile. ``rename_to``: once read, the
    file is given that name, in the very directory checked (the owner may swap a directory of the tree for a
    link to another's at any moment: a rename by path, after the check, could rename another job's file); a
    directory that refuses it (read-only) leaves the file its name. ``head``, with ``most``: of a file over
    ``head + most`` bytes, its first ``head`` bytes too, then its last ``most``, each cut to whole lines (a log:
    its first line and its last ones)."""
    directory = _open_inside(path, base)
    try:
        try:  # in the very directory checked (it cannot be swapped for another meanwhile)
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise PermissionError(f"{path.name} is a symbolic link") from None
            raise
        try:
            data = _read_open(fd, path, directory, most, limit, head)
        finally:
            os.close(fd)
        if rename_to is not None:
            with contextlib.suppress(OSError):
                os.rename(path.name, rename_to, src_dir_fd=directory, dst_dir_fd=directory)
        return data
    finally:
        os.close(directory)


def _read_open(fd: int, path: Path, directory: int, most: int | None, limit: int, head: int = 0) -> bytes:
    """:func:`read_inside`'s read of the file open as ``fd`` in the open ``directory``."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise PermissionError(f"{path.name} is not a regular file")
    if st.st_nlink > 1 and st.st_uid != os.fstat(directory).st_uid:  # another's file given a name here (a hard
        raise PermissionError(f"{path.name} is another user's file linked here")  # link: protected_hardlinks 0)
    if most is None and st.st_size > limit:
        raise OSError(errno.EFBIG, f"{path.name} is over {limit} bytes: not read")
    first = b""
    if most is not None and head and st.st_size > most + head:
        first = os.pread(fd, head, 0)
        first = first[:first.rfind(b"\n") + 1]
    if most is not None and st.st_size > most:
        os.lseek(fd, st.st_size - most, os.SEEK_SET)
    chunks, left = [first] if first else [], limit if most is None else most
    ask = min(left, st.st_size + 1, 1 << 20)  # one byte past its size: a short read is its end, no read of nothing
    while left > 0 and (chunk := os.read(fd, ask)):
        chunks.append(chunk)
        left -= len(chunk)
        if len(chunk) < ask:  # a regular file's read is short only at its end
            break
        ask = min(left, 1 << 20)
    if first and len(chunks) > 1:  # the tail's first line, cut by where it began: not a line of the file
        chunks[1] = chunks[1][chunks[1].find(b"\n") + 1:]
    return b"".join(chunks)


#: A ``[service] python`` setting: the interpreter to run owners' Python work with (else one is looked for).
_configured: list[str] = []


def configure_python(path: str | None) -> None:
    _configured[:] = [path] if path else []
    python_for.cache_clear()


@functools.lru_cache(maxsize=64)
def python_for(who: Identity) -> str | None:
    """A Python interpreter ``who`` may run, of this one's version: ``[service] python``, this one, or the
    system's (this one may live where they cannot go, e.g. under /root). ``None`` if there is none."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [*_configured, sys.executable, shutil.which(version) or "", f"/usr/bin/{version}"]
    for python in candidates:
        if not python:
            continue
        try:
            done = run_as(who, [python, "-S", "-c", "pass"], timeout=30)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return python
    return None


def site_dirs() -> list[str]:
    """This installation's package directories, for a Python run as another user (``site.addsitedir`` each)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


__all__ = ["Identity", "OwnerError", "can_switch", "configure_python", "copy_as", "fs_as", "identity", "lookup",
           "owner_environ", "python_for", "read_inside", "read_tail_as", "readable_by", "run_as", "run_as_waited",
           "setpriv",
           "site_dirs", "switch_argv"]
