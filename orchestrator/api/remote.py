"""The remote transport: the API through a running service (being rebuilt on the one-API design)."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

from ..core.errors import OrchestratorError
from .transport import Transport


async def connect_remote(home: Path, stack: AsyncExitStack, *, required: bool) -> Transport | None:
    """The transport through the service on ``home``, or ``None`` when no service holds it."""
    socket = home / "service" / "api.sock"
    if socket.exists() or required:
        raise OrchestratorError(f"a service holds {home}: the remote transport is not built yet")
    return None
