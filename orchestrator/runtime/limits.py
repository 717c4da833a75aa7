"""What this machine's ``exec`` allows a run: checked at ``add()`` and at the split, not at run time."""

from __future__ import annotations

import os
from functools import cache

#: Room kept for what the job wrapper adds to the environment (ORCH_* variables, retry arguments).
WRAPPER_ROOM = 16384


@cache
def exec_limit() -> int:
    """Bytes left for a run's arguments and environment: ``ARG_MAX`` less this process's environment
    (which the local wrapper inherits) and the wrapper's own variables."""
    try:
        arg_max = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        arg_max = 2 * 1024 * 1024
    inherited = sum(len(k) + len(v) + 2 + 8 for k, v in os.environ.items())
    return max(arg_max - inherited - WRAPPER_ROOM, 0)
