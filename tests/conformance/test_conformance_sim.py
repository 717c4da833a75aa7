"""The conformance kit (``orchestrator.plugin.testing``) on the ``sim`` backend (it runs no program: its run
times and outcomes come from its settings, per check; ``faults.json`` makes it unreachable)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator import Backend
from orchestrator.plugin.testing import BackendConformance, Outage

CHECKS: dict[str, dict[str, Any]] = {
    "kill": {"run_seconds": 60},
    "resubmit": {"outcome": {1: ["failed", "completed"]}},
    "hold": {"outcome": {0: ["held", "completed"]}},
    "lost": {"run_seconds": 3, "polled": True},
    "crash": {"run_seconds": 3},
}


class SimDown:
    """The sim's documented fault switch: its polled status queries raise while ``faults.json`` says so."""

    def down(self, home: Path) -> None:
        (home / "backends" / "sim" / "faults.json").write_text(json.dumps({"status": "raise"}))

    def up(self, home: Path) -> None:
        (home / "backends" / "sim" / "faults.json").write_text("{}")


class TestSimConformance(BackendConformance):
    executes = False

    @pytest.fixture
    def conformance_backend(self) -> Backend:
        return Backend("sim")

    @pytest.fixture
    def conformance_outage(self) -> Outage | None:
        return SimDown()

    def settings_for(self, check: str) -> dict[str, Any]:
        return CHECKS.get(check, {})
