"""Where a home's service keeps its socket and its description (shared by the service and its clients,
so a client does not import the server side)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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

    def read_info(self) -> dict[str, Any] | None:
        try:
            value = json.loads(self.info.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return value if isinstance(value, dict) else None
