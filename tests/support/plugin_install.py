"""Install a plugin distribution into the running interpreter for a test module, and take it out again.

Used by the tests that prove a third party adds a backend by its entry point
alone: the distribution is pip-installed, the core is told to look for
plugins again, and at the end it is uninstalled so the environment is left
as it was.
"""

from __future__ import annotations

import fcntl
import importlib
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator.runtime import registry as plugins


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False)


def builds_without_isolation() -> bool:
    """Can this environment build a plugin's wheel with what it already has?

    setuptools >= 70.1 builds wheels alone; older ones (>= 61, for
    ``[project]`` metadata) need the ``wheel`` package. Otherwise pip must
    fetch setuptools into an isolated build environment.
    """
    try:
        found = re.match(r"(\d+)\.(\d+)", importlib.metadata.version("setuptools"))
    except importlib.metadata.PackageNotFoundError:
        return False
    if found is None:
        return False
    version = (int(found[1]), int(found[2]))
    return version >= (70, 1) or (version >= (61, 0) and importlib.util.find_spec("wheel") is not None)


def forget_plugins(module: str) -> None:
    """Make a plugin (un)installed by this process visible to it."""
    importlib.invalidate_caches()  # path finders cache directory listings
    sys.modules.pop(module, None)
    plugins.refresh()  # forget what stevedore found before the install


@contextmanager
def one_installer() -> Iterator[None]:
    """Only one process at a time installs a plugin into this environment.

    The suite's workers (pytest-xdist) share one venv and the plugins' source
    trees, where pip builds: two installs of one distribution at once, or an
    uninstall under another's tests, would break both. The lock is on a file
    of the venv, so it also holds against a second copy of the suite that
    shares it.
    """
    lock = Path(sys.prefix) / ".orchestrator-tests-plugin-install.lock"
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


@contextmanager
def installed(src: Path, dist: str, module: str) -> Iterator[None]:
    """``src`` (a distribution's directory) installed while the block runs; skips if there is no pip."""
    if pip("--version").returncode != 0:
        pytest.skip(f"pip is not available to {sys.executable}: cannot install the plugin {dist}")
    with one_installer():
        yield from _installed(src, dist, module)


def _installed(src: Path, dist: str, module: str) -> Iterator[None]:
    args = ["install", "--no-deps", "--no-input"]
    if builds_without_isolation():
        args.append("--no-build-isolation")
    result = pip(*args, str(src))
    if result.returncode != 0:
        pytest.fail(f"pip {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    forget_plugins(module)
    try:
        yield
    finally:
        result = pip("uninstall", "-y", dist)
        forget_plugins(module)
        if result.returncode != 0:
            pytest.fail(f"pip uninstall -y {dist} failed:\n{result.stdout}\n{result.stderr}")
