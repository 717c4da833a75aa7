"""The conformance kit (``orchestrator.plugin.testing``) on the ``local`` backend."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator import Backend
from orchestrator.plugin.testing import BackendConformance


class TestLocalConformance(BackendConformance):
    @pytest.fixture
    def conformance_backend(self) -> Backend:
        return Backend("local")

    def config_for(self, check: str) -> dict[str, Any]:
        # After a crash, a run whose launch began but whose process cannot be found is judged after this long
        # (15 s by default: reference.md): the kit's crash caught such runs mid-spawn.
        return {"backends": {"local": {"start_timeout": 3.0}}} if check == "crash" else {}
