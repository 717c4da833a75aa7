"""One process owns a home at a time: an exclusive ``flock`` on ``<home>/lock``.

A second process is refused with an error naming the holder (its role, PID
and host); the lock goes with the process, however it ends. A holder that is
a command only reading the home (``orchestrator jobs`` on a home nobody held
when it started) lets go within seconds, so a process that wants the home
waits for it (up to :data:`READER_WAIT` seconds) instead of failing. So
does a holder whose process is gone (its PID, on this host, is no more): the
lock is then held only by a child it forked an instant before it died (a
run being started, between its fork and its exec), which lets go as the
child execs.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import time
from pathlib import Path

from ..core.errors import HomeLockedError

#: The lock holder's name for ``orchestrator serve``.
SERVICE_ROLE = "the orchestrator service"
#: The lock holder's name for a service started by itself to watch a home (``serve --watcher``).
WATCHER_ROLE = f"{SERVICE_ROLE} (watcher)"
#: The lock holder's name for a command that only reads (``jobs``, ``show``, ``peek``, ``report``).
READER_ROLE = "an orchestrator command reading it"
#: Seconds a process waits for a reading command to let go of the home (it refreshes, prints, closes).
READER_WAIT = 30.0


class HomeLock:
    """An exclusive, advisory lock on a home, released when the process exits."""

    def __init__(self, path: Path, role: str = "") -> None:
        self.path = path
        #: Written in the lock file, for the message another process gets ("the orchestrator service").
        self.role = role
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + READER_WAIT
        empty_since: float | None = None  # since when the held lock's file has named no one, if it names no one
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                written = os.pread(fd, 200, 0).decode(errors="replace").strip()
                holder = written or "another process"
                now = time.monotonic()
                empty_since = (empty_since or now) if not written else None
                waiting = now < deadline and self.role != READER_ROLE
                # a reading command lets go in a moment, and so does a holder that is gone; a lock whose file names
                # no one is being taken (the holder's name follows at once) or let go (release empties the file,
                # then closes it): either is over within a second (a process waiting for a reader saw the one
                # instant and gave up, when it had waited a second already)
                if waiting and (holder.startswith(READER_ROLE) or _gone(written) or (
                        empty_since is not None and now - empty_since < 1.0)):
                    time.sleep(0.05)
                    continue
            os.close(fd)
            raise HomeLockedError(
                f"orchestrator home {self.path.parent} is in use by {holder}; " + (
                    "the CLI and Orchestrator(home) go through it (service=False asks for the home itself); "
                    "or stop the service first" if holder.startswith(SERVICE_ROLE) else
                    "close that orchestrator (or talk to its service) first")
            ) from None
        os.ftruncate(fd, 0)
        who = f"{self.role}, " if self.role else ""
        os.pwrite(fd, f"{who}pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd

    def holder(self) -> str:
        """What the holder wrote in the lock file (its role and PID), ``""`` if nothing."""
        try:
            return self.path.read_text(errors="replace").strip()
        except FileNotFoundError:
            return ""

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None


def _gone(written: str) -> bool:
    """Is the holder named in the lock file a process of this host that no longer exists?"""
    found = re.search(r"pid (\d+) on (\S+)$", written)
    if found is None or found[2] != socket.gethostname():
        return False
    try:
        os.kill(int(found[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, another user's
    return False
