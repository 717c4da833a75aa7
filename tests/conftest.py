"""Fixtures shared by every test module; keep this file small and generic."""

from __future__ import annotations

import os

import pytest

#: The suite's own homes are not watched by a service started in the background (``[service] autostart``): tests
#: open, close and reopen homes, and check what a process of their own does. The tests of the watcher, and the
#: documents' examples, run as a user would, with it (they take this variable out of their commands' environment).
os.environ.setdefault("ORCHESTRATOR_AUTOSTART", "0")

#: Fixtures of the service tests (``services``, ``shared``), of PostgreSQL (``postgres_server``, ``pg_url``), of
#: the sshds (``ssh_env``, ``ssh_env2``, ``side``) and the test backends (``test_drivers``), usable by name in any
#: module.
pytest_plugins = ("postgres", "served", "ssh_fixtures", "transports", "testdriver",
                  "orchestrator.plugin.testing")  # the backend conformance kit: tests/conformance/


@pytest.fixture
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio only."""
    return "asyncio"
