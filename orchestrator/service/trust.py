"""What a service checks and tightens before it opens a home: who it may run work for, and its files' modes.

A service that admits users other than its own (``[service] users`` or
``admins``, or tokens issued to other users) runs their work with their ids
(``docs/reference.md``, "Running work as its owner"): it must run as root
(or hold CAP_SETUID and CAP_SETGID), and every user it names must be an OS
user. Otherwise it refuses to start, saying why and what to do.

Every service runs with umask 077, and at start makes what already exists
in its home its own alone: the repository, logs and backend ledgers 0600,
their directories 0700, while the directories a run's owner must cross
(the home, ``workspace``, ``backends/<name>``) are made traversable (``workspace``
and ``backends`` 0711, the home ``o+x``) on a multi-user service. Each job's own directory is made its owner's when it
next runs.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from collections.abc import Iterable
from pathlib import Path

from ..core.errors import ConfigError
from ..plugin.users import can_switch


def others(named: Iterable[str], own: str) -> list[str]:
    """The users named besides the service's own, in order, once each."""
    return sorted({n for n in named if n != own})


def check_users(named: Iterable[str], own: str) -> None:
    """Refuse a multi-user service that cannot act as its users (see the module docstring)."""
    users = others(named, own)
    if not users:
        return
    missing = []
    for name in users:
        try:
            pwd.getpwnam(name)
        except KeyError:
            missing.append(name)
    if missing:
        raise ConfigError(f"[service] users, admins or tokens name {', '.join(missing)}, not users of this system: "
                          "a multi-user service runs each user's work as that OS user; remove them or add the users")
    if not can_switch():
        raise ConfigError(f"a multi-user service (it admits {', '.join(users)}) runs each user's work as that user "
                          f"and must run as root (or with CAP_SETUID and CAP_SETGID), not as {own}: start it as "
                          "root, or remove [service] users and admins (and the other users' tokens)")


#: Entries of a home that others may need to cross on a multi-user service (the rest is the service's alone).
TRAVERSED = ("workspace", "backends")


def lock_down(home: Path, multi: bool) -> None:
    """umask 077 from now on; what exists in ``home`` made the service's alone (see the module docstring)."""
    os.umask(0o077)
    if multi:  # made now, traversable, before anything made with umask 077 would close them to the owners
        for name in TRAVERSED:
            (home / name).mkdir(exist_ok=True)
    with contextlib.suppress(OSError):
        if multi:  # its owners cross it to their jobs' dirs and the wrapper's scripts (nothing in it is open)
            os.chmod(home, stat.S_IMODE(home.stat().st_mode) | 0o011)
    for entry in _entries(home):
        path = home / entry.name
        with contextlib.suppress(OSError):
            if entry.is_symlink() or entry.name in ("bin", "service"):
                continue  # the wrapper's scripts are everyone's; the service dir's modes are set by the service
            if entry.is_dir():
                if entry.name in TRAVERSED:
                    os.chmod(path, 0o711 if multi else 0o700)
                    _inside(path, multi, top=entry.name)
                else:
                    os.chmod(path, 0o700)
            elif entry.is_file():
                os.chmod(path, 0o600)


def _entries(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []


def _inside(path: Path, multi: bool, *, top: str) -> None:
    """``workspace``: each job dir closed to others (its owner's from its next run on); ``backends``: each
    backend's dir traversable (an owner's events file is there), its files the service's or their owner's."""
    for entry in _entries(path):
        with contextlib.suppress(OSError):
            if entry.is_symlink():
                continue
            if top == "workspace" and entry.is_dir():
                st = entry.stat()
                if st.st_uid == os.getuid():
                    os.chmod(entry.path, 0o700)
            elif top == "backends" and entry.is_dir():
                os.chmod(entry.path, 0o711 if multi else 0o700)
                for f in _entries(Path(entry.path)):
                    if f.is_file(follow_symlinks=False) and f.stat(follow_symlinks=False).st_uid == os.getuid():
                        os.chmod(f.path, 0o600)
