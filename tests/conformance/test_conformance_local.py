"""The conformance kit (``orchestrator.plugin.testing``) on the ``local`` backend."""

from __future__ import annotations

import pytest

from orchestrator import Backend
from orchestrator.plugin.testing import BackendConformance


class TestLocalConformance(BackendConformance):
    @pytest.fixture
    def conformance_backend(self) -> Backend:
        return Backend("local")
