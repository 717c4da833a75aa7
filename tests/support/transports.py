"""One API, two transports, two repositories: the ``api_home`` fixture runs a test four ways.

``api_home`` is a home directory. Embedded, nothing holds it, and
``Orchestrator(home=api_home)`` opens it in the test's process. Through the
service, a real ``orchestrator serve`` subprocess holds it, and the same
``Orchestrator(home=api_home)`` speaks to it over its socket (the remote
transport). Each way runs on the default repository (the home's SQLite
file) and on PostgreSQL (``-pg``: a fresh database of the session's private
server, named in the home's ``[repository] url``). The test body is the
same: the assertions hold for all four.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import pytest
from postgres import PostgresServer, postgres_unavailable
from served import Service

#: Settings every API test runs with, written to the home's orchestrator.toml so that a service reads
#: them too (the documented defaults, today).
HOME_TOML = "[core]\n"


@pytest.fixture(params=["embedded", "service", "embedded-pg", "service-pg"])
def api_home(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    home = tmp_path / "home"
    home.mkdir()
    settings = HOME_TOML
    if request.param.endswith("-pg"):
        why = postgres_unavailable()
        if why is not None:
            pytest.skip(why)
        server: PostgresServer = request.getfixturevalue("postgres_server")
        settings += f"[repository]\nurl = {server.database()!r}\n"
    (home / "orchestrator.toml").write_text(settings)
    yield from opened(home, served=request.param.startswith("service"))


def opened(home: Path, *, served: bool) -> Iterator[Path]:
    """``home`` as a fixture yields it: left to the test's process, or held by a real service until the test ends."""
    if not served:
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
