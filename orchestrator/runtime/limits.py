"""What this machine's ``exec`` allows a run: checked at ``add()`` and at the split, not at run time."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from functools import cache
from typing import Any

from ..core.errors import JobError
from ..core.model import Executable
from ..plugin.settings import SettingsError
from . import registry

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


def check_subjob(spec: Mapping[str, Any], where: str, changed: Collection[str]) -> None:
    """A subjob the split changed, checked as ``add()`` checks a job (``changed``: the delta's paths)."""
    app = spec["application"]
    Executable(app["exe"], app.get("args", []), app.get("env", {})).validate(where, exec_limit())
    backend_changed = any(p.startswith("backend.") for p in changed)
    if not backend_changed and "application.exe" not in changed:
        return
    cls = registry.driver_class(spec["backend"]["name"])
    settings = spec["backend"].get("settings", {})
    if backend_changed:
        try:
            cls.validate_settings(settings)
        except SettingsError as exc:
            raise JobError(str(exc), fqid=where, field=f"backend.{exc.field}") from None
    problem = cls.check_executable(app["exe"], settings)
    if problem is not None:
        raise JobError(problem, fqid=where, field="application.exe")
