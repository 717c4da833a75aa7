"""The conformance kit (``orchestrator.plugin.testing``) on the ``slurm`` backend: the real one-node cluster
of ``tests/support/slurmd.py``, one for the session."""

from __future__ import annotations

import pytest
from slurmd import SlurmCluster, slurm_cluster  # noqa: F401 - the session fixture, used by name

from orchestrator import Backend
from orchestrator.plugin.testing import BackendConformance


class TestSlurmConformance(BackendConformance):
    @pytest.fixture
    def conformance_backend(self, slurm_cluster: SlurmCluster) -> Backend:  # noqa: F811
        return Backend("slurm", slurm_conf=str(slurm_cluster.conf))
