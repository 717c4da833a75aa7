"""What a run left behind where it ran: its wrapper log, the tail of its stderr (read once it ended)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..core.runlog import parse_log
from ..plugin.contract import RunHandle
from ..plugin.wrapper import log_path
from .monitor import Ending

#: Lines of stderr a failure's reason quotes, and the longest line kept.
STDERR_LINES = 3
STDERR_WIDTH = 200


def read_ending(handle: RunHandle) -> Ending:
    """The run's log and stderr tail, from its output dir (a blocking read: the monitor runs it in a thread).

    The attempt's own log, ``orch.<attempt>.log``, is renamed ``orch.log`` once read: the name users
    look for after a run ended.
    """
    out = handle.outputdir
    path = log_path(out, handle.attempt)
    try:
        log = parse_log(path.read_text(errors="replace"))
    except FileNotFoundError:
        log = None
    else:
        if path.name != "orch.log":
            with contextlib.suppress(OSError):  # a read-only output dir: the attempt's name stays
                path.replace(out / "orch.log")
    return Ending(log=log, stderr_tail=stderr_tail(out / "stderr"))


def stderr_tail(path: Path, lines: int = STDERR_LINES) -> str | None:
    """The last non-empty lines of a file, joined with " | ", or ``None``."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - 4096))
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    kept = [line.strip()[:STDERR_WIDTH] for line in data.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or None
