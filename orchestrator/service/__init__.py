"""The service: ``orchestrator serve`` owning a home, its control API, and a client of that API.

The server side (``run_service``) is imported on first use, so that a client does not load it.
"""

from typing import Any

from .client import ServiceClient, ServiceUnavailable, connect
from .paths import ServicePaths

__all__ = ["ServiceClient", "ServicePaths", "ServiceUnavailable", "connect", "run_service"]


def __getattr__(name: str) -> Any:
    if name == "run_service":
        from .daemon import run_service

        return run_service
    raise AttributeError(name)
