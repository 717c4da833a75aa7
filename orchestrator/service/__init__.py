"""``orchestrator serve``: the service owning a home (the HTTP server, the control adapter, the status page).

Clients reach it through the API (``Orchestrator(home)`` takes the remote
transport by itself); :class:`ServiceClient` (``orchestrator.service.ServiceClient(socket=...)``, defined in
:mod:`orchestrator.api.client`) is the lower-level HTTP client, and :class:`ServiceUnavailable` what it raises
when no service answers.
"""

from ..api.client import ServiceClient, ServiceUnavailable, StandbyService

__all__ = ["ServiceClient", "ServiceUnavailable", "StandbyService"]
