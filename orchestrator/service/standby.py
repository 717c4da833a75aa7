"""The standby of an active/standby pair: what it answers while another service writes the shared repository.

Two ``orchestrator serve`` on one PostgreSQL repository (two homes, standing
for two hosts): the one that holds the repository's lease is active, the
other waits. The standby holds its own home (its lock, its socket) and
answers there, so that the CLI and ``Orchestrator(home)`` on its home find
it: ``GET /health`` says it is the standby and where the active one is (its
socket, TCP port, host and PID, as published in the lease), and every other
request is answered 503 with the same, which the clients follow
(:func:`orchestrator.api.client.connect`). The same callers as the active
service's may ask (:func:`.api.caller_of`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .access import Access
from .api import caller_of
from .http import Request, Response

if TYPE_CHECKING:  # (the lease's module needs asyncpg, which only a shared repository's service has)
    from ..runtime.postgres.lease import LeaseView


class Standby:
    """The HTTP answers of a standby; :meth:`saw` keeps what it knows of the active service current."""

    def __init__(self, home: Path, where: str, access: Access) -> None:
        self.home = home
        self.where = where
        self.access = access
        self.view: LeaseView | None = None
        self.since = time.time()

    def saw(self, view: LeaseView | None) -> None:
        self.view = view

    def state(self) -> dict[str, Any]:
        view = self.view
        return {"ok": True, "role": "standby", "pid": os.getpid(), "home": str(self.home), "repository": self.where,
                "standby_since": self.since, "leader": view.address if view is not None and not view.free else None,
                "holder": view.holder if view is not None else None, "time": time.time()}

    async def __call__(self, req: Request) -> Response:
        caller = caller_of(req, self.access)
        if isinstance(caller, Response):
            return caller
        state = self.state()
        if req.path in ("/health", "/api/health") and req.method in ("GET", "HEAD", "POST"):
            return Response.json(state)
        message = (f"this orchestrator service (pid {os.getpid()}, home {self.home}) is the standby on the "
                   f"repository {self.where}; the active service is {self.view.describe() if self.view else 'unknown'}"
                   ": ask it")
        return Response.json({"error": "standby", "message": message, "leader": state["leader"],
                              "fqid": None, "field": None}, 503)
