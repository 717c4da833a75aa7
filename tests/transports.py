"""One API, two transports: the ``api_home`` fixture runs a test once embedded and once through a service.

``api_home`` is a home directory. Embedded, nothing holds it, and
``Orchestrator(home=api_home)`` opens it in the test's process. Through the
service, a real ``orchestrator serve`` subprocess holds it, and the same
``Orchestrator(home=api_home)`` speaks to it over its socket (the remote
transport). The test body is the same: the assertions hold for both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from served import Service

#: Settings every API test runs with, written to the home's orchestrator.toml so that a service reads
#: them too (the documented defaults, today).
HOME_TOML = "[core]\n"


@pytest.fixture(params=["embedded", "service"])
def api_home(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text(HOME_TOML)
    if request.param == "embedded":
        yield home
        return
    service = Service(home).start()
    try:
        yield home
    finally:
        service.stop()
