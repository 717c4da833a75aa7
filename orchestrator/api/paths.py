"""Where a home's service keeps its socket and its description (shared by the service and its clients,
so a client does not import the server side)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServicePaths:
    """Where a home's service keeps its socket and its description."""

    home: Path

    @property
    def dir(self) -> Path:
        return self.home / "service"

    @property
    def socket(self) -> Path:
        return self.dir / "api.sock"

    @property
    def info(self) -> Path:
        return self.dir / "service.json"
