"""The service: ``orchestrator serve`` owning a home, its control API, and a client of that API."""

from .client import ServiceClient, ServiceUnavailable, connect
from .daemon import ServicePaths, run_service

__all__ = ["ServiceClient", "ServicePaths", "ServiceUnavailable", "connect", "run_service"]
