"""``orchestrator serve``: the service owning a home (the HTTP server, the control adapter, the status page).

Clients reach it through the API (``Orchestrator(home)`` takes the remote
transport by itself); :class:`~orchestrator.api.client.ServiceClient` is the
lower-level HTTP client.
"""
