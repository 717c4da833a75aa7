"""One API, two transports: the ``api_home`` fixture runs a test once embedded and once through a service.

``api_home`` is a home directory. Embedded, nothing holds it, and
``Orchestrator(home=api_home)`` opens it in the test's process. Through the
service, a real ``orchestrator serve`` subprocess holds it, and the same
``Orchestrator(home=api_home)`` speaks to it over its socket (the remote
transport). The test body is the same: the assertions hold for both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
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


async def collect_events(orch: Any, seen: list[Any], until: Callable[[list[Any]], bool],
                         opened: anyio.Event) -> None:
    """Append every event of ``orch.events()`` to ``seen`` until ``until(seen)`` holds, then close the stream.

    The stream is left by ``break`` and closed at once (``aclosing``), not cancelled while it reads:
    through a service, cancelling a read of the event stream's socket can race anyio's reader callback,
    which asyncio then reports as an ``InvalidStateError`` in a callback (harmless, but the test runner
    raises it).
    """
    async with aclosing(orch.events()) as stream:
        opened.set()
        async for ev in stream:
            seen.append(ev)
            if until(seen):
                break
