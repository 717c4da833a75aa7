"""The conformance kit (``orchestrator.plugin.testing``) on the ``ssh`` backend: two real sshds on loopback
(``tests/support/sshd.py``); stopping them makes the backend unreachable while the runs go on."""

from __future__ import annotations

from pathlib import Path

import pytest
from sshd import SshEnv

from orchestrator import Backend
from orchestrator.plugin.testing import BackendConformance, Outage


class SshdsDown:
    def __init__(self, env: SshEnv) -> None:
        self.env = env

    def down(self, home: Path) -> None:
        for sshd in self.env.sshds:
            sshd.stop()

    def up(self, home: Path) -> None:
        for sshd in self.env.sshds:
            sshd.start()


class TestSshConformance(BackendConformance):
    @pytest.fixture
    def conformance_backend(self, ssh_env2: SshEnv) -> Backend:
        return Backend("ssh", **ssh_env2.settings())

    @pytest.fixture
    def conformance_outage(self, ssh_env2: SshEnv) -> Outage | None:
        return SshdsDown(ssh_env2)

    @pytest.fixture
    def conformance_side(self, side: Path) -> Path:
        return side  # the hosts' login user writes there
