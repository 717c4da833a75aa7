"""The conformance kit (``orchestrator.plugin.testing``) on the ``dask`` backend: a ``LocalCluster`` of two
worker processes started once for the module, reached by its scheduler's address (a cluster of the driver's
own starts for each home in seconds: ``tests/integration/test_dask.py`` covers that mode)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator import Backend
from orchestrator.plugin.testing import BackendConformance

distributed: Any = pytest.importorskip("distributed", reason="the dask backend needs the 'dask' extra")


@pytest.fixture(scope="module")
def dask_scheduler() -> Iterator[str]:
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=4, processes=True, dashboard_address=None)
    try:
        yield str(cluster.scheduler_address)
    finally:
        cluster.close()


class TestDaskConformance(BackendConformance):
    @pytest.fixture
    def conformance_backend(self, dask_scheduler: str) -> Backend:
        return Backend("dask", scheduler=dask_scheduler)
