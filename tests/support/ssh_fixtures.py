"""Fixtures of the tests that run on private sshds: the hosts, and a directory their runs write to.

``ssh_env`` is one host, ``ssh_env2`` two; both skip the test (saying why) only where sshd cannot be
installed or started. ``side`` is a directory every host's user may write, where runs leave a line per
execution so that a test counts them; it is removed afterwards.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sshd import SshEnv, env_or_skip, shared_dir


@pytest.fixture
def ssh_env() -> Iterator[SshEnv]:
    env = env_or_skip(1)
    yield env
    env.cleanup()


@pytest.fixture
def ssh_env2() -> Iterator[SshEnv]:
    env = env_or_skip(2)
    yield env
    env.cleanup()


@pytest.fixture
def side() -> Iterator[Path]:
    path = shared_dir("orch-side-")
    yield path
    shutil.rmtree(path, ignore_errors=True)
