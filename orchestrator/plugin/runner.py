"""The worker-side runner: start the job wrapper in its own process group, keep its pid by key, kill by key.

For backends that hand the orchestrator's work to an engine of their own (a
dask worker, a thread pool, a remote agent): the engine calls
:func:`run_wrapper` where the run is to happen; the driver asks for a kill
with :func:`request_kill`, from any process that sees the same control dir.
Standard library only, so that it can run wherever the engine runs.

The control dir holds, per run key, ``<key>.pid`` (the wrapper's process
group, while it runs) and ``<key>.kill`` (a kill asked for). A kill asked
for before the run started stops it from starting.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

#: Seconds between two looks for a kill request while the wrapper runs.
POLL = 0.2
#: Seconds between SIGTERM and SIGKILL of a killed run's process group.
KILL_GRACE = 2.0


def run_wrapper(shell: str, wrapper: str, runfile: str, controldir: str, key: str,
                owner: tuple[int, int, tuple[int, ...]] | None = None) -> int:
    """Run ``shell wrapper runfile`` in a new session; its exit code (``-1``: killed before it started).

    ``owner``: the uid, gid and groups of the run's owner, when it is not the worker's own user (the worker then
    runs as root, and the wrapper starts with the owner's ids).
    """
    control = Path(controldir)
    control.mkdir(parents=True, exist_ok=True)
    kill, pidfile = control / f"{key}.kill", control / f"{key}.pid"
    if kill.exists():
        return -1
    ids: dict[str, Any] = {} if owner is None else {"user": owner[0], "group": owner[1],
                                                    "extra_groups": list(owner[2])}
    proc = subprocess.Popen([shell, wrapper, runfile], start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **ids)
    pidfile.write_text(str(proc.pid))
    killed_at: float | None = None
    try:
        while (code := proc.poll()) is None:
            if kill.exists():
                now = time.monotonic()
                if killed_at is None:
                    killed_at = now
                    _signal(proc.pid, signal.SIGTERM)
                elif now - killed_at > KILL_GRACE:
                    _signal(proc.pid, signal.SIGKILL)
            time.sleep(POLL)
        if killed_at is not None:
            _signal(proc.pid, signal.SIGKILL)  # what the application left behind in its group
        return code
    finally:
        pidfile.unlink(missing_ok=True)


def request_kill(controldir: str | os.PathLike[str], key: str) -> int | None:
    """Ask for run ``key`` to be killed; signal its group at once where it runs on this machine. Its pid, if
    it is running here."""
    control = Path(controldir)
    control.mkdir(parents=True, exist_ok=True)
    (control / f"{key}.kill").touch()
    pid = running_pid(controldir, key)
    if pid is not None:
        _signal(pid, signal.SIGTERM)
    return pid


def running_pid(controldir: str | os.PathLike[str], key: str) -> int | None:
    """The wrapper's pid while run ``key`` runs (its pid file is there), else ``None``."""
    try:
        return int((Path(controldir) / f"{key}.pid").read_text())
    except (OSError, ValueError):
        return None


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
