"""The conformance kit (``orchestrator.plugin.testing``) on the ``slurm`` backend: the real one-node cluster
of ``tests/support/slurmd.py``, one for the session; its controller stopped (and started again from its
saved state) makes the cluster unreachable while its jobs go on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from slurmd import SlurmCluster, slurm_cluster  # noqa: F401 - the session fixture, used by name

from orchestrator import Backend
from orchestrator.plugin.testing import BackendConformance, Outage


class ControllerDown:
    def __init__(self, cluster: SlurmCluster) -> None:
        self.cluster = cluster

    def down(self, home: Path) -> None:
        self.cluster.stop_controller()

    def up(self, home: Path) -> None:
        self.cluster.start_controller()


class TestSlurmConformance(BackendConformance):
    @pytest.fixture
    def conformance_backend(self, slurm_cluster: SlurmCluster) -> Backend:  # noqa: F811
        return Backend("slurm", slurm_conf=str(slurm_cluster.conf))

    @pytest.fixture
    def conformance_outage(self, slurm_cluster: SlurmCluster) -> Outage | None:  # noqa: F811
        return ControllerDown(slurm_cluster)

    def config_for(self, check: str) -> dict[str, Any]:
        # Slurm's clients wait ~18 s for a controller that is gone: the driver gives up on them sooner.
        return {"backends": {"slurm": {"command_timeout": 4.0}}} if check == "lost" else {}
