"""The backends' drivers of one runtime: each made on first need, all closed with the home.

A reader (a home opened to read only) asks drivers what they can do, never to run anything: its drivers keep
whatever files they make (the wrapper's scripts, ledgers) in a scratch directory removed at close, so reading
never writes the home, and a home on read-only media can be read.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..plugin.contract import Capabilities, Driver, DriverContext
from ..plugin.logs import get_logger
from . import registry
from .config import Config


class Drivers:
    def __init__(self, data_dir: Path, config: Config, *, readonly: bool) -> None:
        self.data_dir = data_dir
        self.config = config
        self.readonly = readonly
        self._made: dict[str, Driver] = {}
        self._scratch: Path | None = None

    def __iter__(self) -> Iterator[Driver]:
        return iter(list(self._made.values()))

    def items(self) -> list[tuple[str, Driver]]:
        return list(self._made.items())

    def capabilities(self, backend: str, settings: Mapping[str, Any]) -> Capabilities:
        """What the backend's driver can do for runs of these settings."""
        return self.get(backend).capabilities_for(settings)

    def get(self, backend: str) -> Driver:
        """The backend's driver, made on first need (its actor and loops start with the first instruction)."""
        driver = self._made.get(backend)
        if driver is None:
            home = self.data_dir
            if self.readonly:
                if self._scratch is None:
                    self._scratch = Path(tempfile.mkdtemp(prefix="orch-reader-"))
                home = self._scratch
            statedir = home / "backends" / backend
            statedir.mkdir(parents=True, exist_ok=True)
            context = DriverContext(home=home, config=self.config.backend(backend), statedir=statedir,
                                    log=get_logger(backend=backend))
            driver = self._made[backend] = registry.driver_class(backend)(context)
        return driver

    async def aclose(self, log: Any) -> None:
        """Close every driver (one that fails is logged: it must not lose the home's state), then the scratch."""
        for driver in self:
            try:
                await driver.aclose()
            except Exception as exc:
                log.warning("driver close failed", backend=driver.name, error=repr(exc))
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
