"""What a run left behind where it ran: its wrapper log, the tail of its stderr (read once it ended)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from ..core.runlog import parse_log
from ..plugin.contract import RunHandle
from ..plugin.users import read_inside
from ..plugin.wrapper import log_path
from .monitor import Ending

#: Lines of stderr a failure's reason quotes, and the longest line kept.
STDERR_LINES = 3
STDERR_WIDTH = 200


def read_ending(handle: RunHandle) -> Ending:
    """The run's log and stderr tail, from its output dir (a blocking read: the monitor runs it in a thread).

    The attempt's own log, ``orch.<attempt>.log``, is renamed ``orch.log`` once read: the name users
    look for after a run ended. Both are read without following a link out of the output dir (the run's
    owner may have made them links to files only the orchestrator may read): such a file counts as missing.
    """
    out = handle.outputdir
    path = log_path(out, handle.attempt)
    # inside the top-level job's dir, which only the orchestrator may replace (all below may be the owner's)
    top = handle.jobdir.parent if "." in handle.fqid else handle.jobdir
    try:
        log = parse_log(read_inside(path, top).decode(errors="replace"))
    except OSError:
        log = None
    else:
        if path.name != "orch.log":
            with contextlib.suppress(OSError):  # a read-only output dir: the attempt's name stays
                path.replace(out / "orch.log")
    return Ending(log=log, stderr_tail=stderr_tail(out / "stderr", top))


def stderr_tail(path: Path, within: Path | None = None, lines: int = STDERR_LINES) -> str | None:
    """The last non-empty lines of a file, joined with " | ", or ``None``."""
    try:
        data = read_inside(path, within or path.parent, 4096).decode(errors="replace")
    except OSError:
        return None
    kept = [line.strip()[:STDERR_WIDTH] for line in data.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or None
