"""A home is always watched while it has active jobs (pueue's daemon, Bazel's server).

An orchestrator that opened the home itself and closes with jobs still active starts the home's service in the
background, ``orchestrator serve --watcher``, unless one runs: it goes on monitoring, retrying, merging and
notifying, answers every later command (they go through it, as through any service), and stops by itself once
nothing has been active for ``[service] watcher_quiet_seconds``. Two closers racing start two processes; the
home's lock lets one of them serve, and the other leaves at once without a word.

A home that a plain ``orchestrator serve`` (supervisord's) ever served is marked :data:`MANAGED` and never gets
a watcher; such a service that finds a watcher holding its home asks it to stop, and takes over.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from .paths import ServicePaths

#: Marks a home served by a plain ``orchestrator serve``: no watcher is ever started for it.
MANAGED = "managed"
#: The watcher's log, beside its socket.
LOG = "watcher.log"
#: ``ORCHESTRATOR_AUTOSTART``: ``0`` or ``1`` overrides the default of ``[service] autostart`` (not a home's own).
ENV = "ORCHESTRATOR_AUTOSTART"


def autostart(home: Path, default: bool) -> bool:
    """Whether closing with active jobs starts a watcher: the home's own setting, else the environment, else
    ``default`` (the packaged settings'); never for a home that a managed service ever held."""
    if (ServicePaths(home).dir / MANAGED).exists():
        return False
    try:
        own = tomllib.loads((home / "orchestrator.toml").read_text()).get("service", {}).get("autostart")
    except (OSError, tomllib.TOMLDecodeError):
        own = None
    if isinstance(own, bool):
        return own
    env = os.environ.get(ENV, "").strip().lower()
    if env:
        return env not in ("0", "false", "no", "off")
    return default


def start_watcher(home: Path, repository: str | None = None) -> None:
    """Start ``orchestrator serve --watcher`` on ``home``, detached (its own session, no terminal)."""
    paths = ServicePaths(home)
    paths.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(paths.dir / LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        command = [sys.executable, "-m", "orchestrator.cli", "--home", str(home)]
        if repository:
            command += ["--repository", repository]
        subprocess.Popen([*command, "serve", "--watcher"], stdin=subprocess.DEVNULL, stdout=fd,
                         stderr=subprocess.STDOUT, start_new_session=True, close_fds=True, cwd="/")
    finally:
        os.close(fd)


def ask_to_leave(home: Path, wait: float = 20.0) -> None:
    """A command that needs the home itself (a file written with the caller's rights): the home's watcher, if one
    holds it, is asked to stop (SIGTERM by the PID its lock names) and waited for; the command's close starts
    another if jobs are still active."""
    from ..runtime.homelock import WATCHER_ROLE
    from .client import service_holds

    try:
        holder = (home / "lock").read_text(errors="replace").strip()
    except OSError:
        return
    if not holder.startswith(WATCHER_ROLE):
        return
    with contextlib.suppress(ValueError, IndexError, ProcessLookupError):
        os.kill(int(holder.split("pid ", 1)[1].split()[0]), signal.SIGTERM)
    deadline = time.monotonic() + wait
    while service_holds(home) and time.monotonic() < deadline:
        time.sleep(0.1)


def mark_managed(home: Path) -> None:
    """A plain ``orchestrator serve`` holds ``home``: from now on it is never given a watcher."""
    paths = ServicePaths(home)
    paths.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    (paths.dir / MANAGED).touch(mode=0o600)


__all__ = ["ENV", "LOG", "MANAGED", "ask_to_leave", "autostart", "mark_managed", "start_watcher"]
