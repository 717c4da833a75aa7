"""Fixtures shared by every test module; keep this file small and generic."""

from __future__ import annotations

import pytest

#: Fixtures of the service tests (``services``, ``shared``), of PostgreSQL (``postgres_server``, ``pg_url``), of
#: the sshds (``ssh_env``, ``ssh_env2``, ``side``) and the test backends (``test_drivers``), usable by name in any
#: module.
pytest_plugins = ("postgres", "served", "ssh_fixtures", "transports", "testdriver",
                  "orchestrator.plugin.testing")  # the backend conformance kit: tests/conformance/


@pytest.fixture
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio only."""
    return "asyncio"
