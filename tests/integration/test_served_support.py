"""The suite's own service starter: a service that never gets ready is not left running.

Fixtures write ``Service(...).start()`` before their ``try``; on a machine loaded enough that a start times out,
each such service was left behind, still starting, for the rest of the session (found with 28 of them).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import served
from served import Service


def test_a_start_that_times_out_stops_what_it_launched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(served, "START_TIMEOUT", 0.5)
    service = Service(tmp_path / "home", argv=["sleep", "600"])  # never writes service.json: never ready
    with pytest.raises(AssertionError, match="did not answer"):
        service.start()
    pid = service.pid
    assert service.proc_().poll() is not None  # reaped: no process is left under that pid of ours
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
