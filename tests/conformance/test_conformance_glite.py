"""The conformance kit (``orchestrator.plugin.testing``) on the ``glite`` backend: its WMS service as a child
process (``orch_glite.testing.WMSProcess``); SIGKILLing it makes the backend unreachable, and it starts again
on the same port with the same state."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from orch_glite.testing import WMSProcess

from orchestrator import Backend
from orchestrator.plugin.testing import BackendConformance, Outage


class WmsDown:
    def __init__(self, wms: WMSProcess) -> None:
        self.wms = wms

    def down(self, home: Path) -> None:
        self.wms.kill(signal.SIGKILL)

    def up(self, home: Path) -> None:
        self.wms.start()


class TestGliteConformance(BackendConformance):
    @pytest.fixture
    def wms(self, tmp_path: Path) -> Iterator[WMSProcess]:
        service = WMSProcess(tmp_path / "wms").start()
        try:
            yield service
        finally:
            service.stop()
            service.kill_nodes()

    @pytest.fixture
    def conformance_backend(self, wms: WMSProcess) -> Backend:
        return Backend("glite", endpoint=wms.endpoint)

    @pytest.fixture
    def conformance_outage(self, wms: WMSProcess) -> Outage | None:
        return WmsDown(wms)
