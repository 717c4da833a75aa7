"""Where a home's state lives: which repository (the home's SQLite file, or a shared PostgreSQL), and where the
files that go with its rows are (the job workspaces, the drivers' state dirs).

Read from ``[repository]`` of the settings (or ``--repository URL``): ``url``
empty is the home's own file, ``repository.sqlite``, and the files in the
home; a PostgreSQL ``url`` is that database, and the files in ``shared_dir``,
which every home on the database must see at the same path (or in the home
when none is set: one service alone).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..core.errors import ConfigError
from .repository import POSTGRES_SCHEMES, Repository, shown_url


@dataclass(frozen=True)
class Storage:
    """Where a home's state lives: the repository's rows, and the directory of the files that go with them.

    ``url`` empty: the home's own SQLite file, and the files in the home. A PostgreSQL ``url``: that
    database, and the files in ``shared_dir`` (every home on the database must see it at the same path),
    or in the home when none is set (one service alone).
    """

    home: Path
    url: str = ""
    shared_dir: Path | None = None
    lease_seconds: float = 5.0

    @classmethod
    def of(cls, home: Path, settings: Mapping[str, Any], where: str = "settings") -> Storage:
        """From ``[repository]`` (checked: a bad value names the key)."""
        url = settings.get("url", "")
        if not isinstance(url, str) or (url and urlsplit(url).scheme not in POSTGRES_SCHEMES):
            raise ConfigError(f"{where}: repository.url must be empty (the home's SQLite file) or a PostgreSQL URL "
                              f"(postgresql://...), not {url!r}")
        shared = settings.get("shared_dir", "")
        if not isinstance(shared, str):
            raise ConfigError(f"{where}: repository.shared_dir must be a directory's path, not {shared!r}")
        if shared and not Path(shared).expanduser().is_absolute():
            raise ConfigError(f"{where}: repository.shared_dir must be an absolute path (every home on the "
                              f"repository sees it at the same place), not {shared!r}")
        lease = settings.get("lease_seconds", 5.0)
        if isinstance(lease, bool) or not isinstance(lease, (int, float)) or lease < 1:
            raise ConfigError(f"{where}: repository.lease_seconds must be a number of seconds >= 1, not {lease!r}")
        if shared and not url:
            raise ConfigError(f"{where}: repository.shared_dir is for a shared (PostgreSQL) repository: "
                              "set repository.url too, or leave shared_dir empty")
        return cls(home, url, Path(shared).expanduser() if shared else None, float(lease))

    @property
    def shared(self) -> bool:
        """True for a repository other homes may use too (PostgreSQL)."""
        return bool(self.url)

    @property
    def data_dir(self) -> Path:
        """The root of the job workspaces (``workspace/``) and the drivers' state dirs (``backends/<name>``)."""
        return self.shared_dir if self.shared_dir is not None else self.home

    @property
    def where(self) -> str:
        return shown_url(self.url) if self.url else str(self.home / "repository.sqlite")

    def repository(self, role: str = "") -> Repository:
        """The repository these settings name (PostgreSQL's code is imported only when one is used).

        ``role`` describes this process in the lease another process reads ("the orchestrator service").
        """
        if not self.url:
            from .sqlite_repository import SqliteRepository

            return SqliteRepository(self.home / "repository.sqlite")
        try:
            from .postgres.repository import PgRepository
        except ImportError as exc:
            raise ConfigError(f"repository.url names a PostgreSQL database, which needs asyncpg ({exc}): "
                              "pip install 'orchestrator[postgresql]'") from None

        holder = f"{role or 'an orchestrator'}, pid {os.getpid()} on {socket.gethostname()}, home {self.home}"
        return PgRepository(self.url, holder=holder, lease_seconds=self.lease_seconds)
