"""The test backends of ``driver_dist/`` (``chatty``, ``stalling``, ``bulkonly``, ``hollow``, ``limbo``),
registered for one test by entry points.

``driver_dist`` holds a package and its distribution's metadata, as pip would leave them in
site-packages; putting the directory on ``sys.path`` is all it takes for the orchestrator to find the
backends, exactly as it finds an installed third party's. ``PYTHONPATH`` is set too, so that a
service or a CLI started by the test finds them as well.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import plugins

DIST = Path(__file__).resolve().parent / "driver_dist"


@pytest.fixture
def test_drivers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(DIST))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(DIST), os.environ.get("PYTHONPATH")])))
    plugins.refresh()
    yield
    monkeypatch.undo()
    plugins.refresh()
