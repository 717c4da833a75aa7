"""The conformance kit (``orchestrator.plugin.testing``) on a third-party plugin: the distribution in
``tests/support/thirdparty_plugin`` pip-installed for this module and found through its entry point only.

Its runs are children of the orchestrator's process (it says so): they do not survive the orchestrator's
death, so the kit's SIGKILL checks skip (``survives_restart = False``)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from plugin_install import installed

from orchestrator import Backend
from orchestrator.plugin.testing import BackendConformance

PLUGIN_SRC = Path(__file__).resolve().parents[1] / "support" / "thirdparty_plugin"


@pytest.fixture(scope="module")
def thirdparty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    src = tmp_path_factory.mktemp("thirdparty") / "orchestrator-echo-backend"
    shutil.copytree(PLUGIN_SRC, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    with installed(src, "orchestrator-echo-backend", "orch_thirdparty_echo"):
        yield


class TestThirdpartyConformance(BackendConformance):
    survives_restart = False

    @pytest.fixture
    def conformance_backend(self, thirdparty: None) -> Backend:
        return Backend("thirdparty")
