"""Settings: the defaults in ``config/orchestrator.toml``, overridden by ``<home>/orchestrator.toml``.

The packaged defaults are the documented ones; a home may override any of
them. Unknown keys are refused with the file and key named.
"""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from ..core.actions import Rule, parse_rules
from ..core.errors import ConfigError
from ..core.statuses import MASTER_ORDERS


def _defaults() -> dict[str, Any]:
    text = (resources.files("orchestrator") / "defaults.toml").read_text()
    return tomllib.loads(text)


#: Tables whose keys are the user's own (backend names, user names), not settings to check against the defaults.
OPEN_TABLES = ("backends.", "postprocess.mail_addresses.")


def _merge(base: dict[str, Any], over: dict[str, Any], where: str, prefix: str = "") -> None:
    for key, value in over.items():
        name = f"{prefix}{key}"
        if key not in base and not prefix.startswith(OPEN_TABLES):
            raise ConfigError(f"{where}: unknown setting {name!r}")
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value, where, f"{name}.")
        else:
            base[key] = value


@dataclass
class Config:
    """The settings in force for one orchestrator."""

    data: dict[str, Any] = field(default_factory=_defaults)

    @classmethod
    def load(cls, home: Path, overrides: dict[str, Any] | None = None) -> Config:
        data = _defaults()
        path = home / "orchestrator.toml"
        if path.exists():
            try:
                _merge(data, tomllib.loads(path.read_text()), str(path))
            except tomllib.TOMLDecodeError as e:
                raise ConfigError(f"{path}: {e}") from None
        if overrides:
            _merge(data, copy.deepcopy(overrides), "Orchestrator(config=...)")
        config = cls(data)
        config.check(str(path))
        return config

    def check(self, where: str) -> None:
        core = self.data["core"]
        if core["master_status_order"] not in MASTER_ORDERS:
            raise ConfigError(f"{where}: core.master_status_order must be one of {MASTER_ORDERS}")
        for key in ("poll_interval", "emulated_bulk_concurrency"):
            if not isinstance(core[key], (int, float)) or core[key] <= 0:
                raise ConfigError(f"{where}: core.{key} must be a positive number")
        if not isinstance(core["fail_on_missing_output"], bool):
            raise ConfigError(f"{where}: core.fail_on_missing_output must be true or false")
        infra = self.data["retry"]["max_infrastructure"]
        if isinstance(infra, bool) or not isinstance(infra, int):
            raise ConfigError(f"{where}: retry.max_infrastructure must be a whole number (negative: as the limits)")
        for key in ("actor_mailbox", "work_limit", "events_buffer"):
            if isinstance(core[key], bool) or not isinstance(core[key], int) or core[key] < 1:
                raise ConfigError(f"{where}: core.{key} must be a whole number >= 1")
        from .storage import Storage  # the check of [repository], where its settings are read

        Storage.of(Path(), self.section("repository"), where)
        length = core["story_length"]
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ConfigError(f"{where}: core.story_length must be a whole number >= 0, not {length!r}")
        chunk = core["submit_chunk"]
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ConfigError(f"{where}: core.submit_chunk must be an integer >= 1, not {chunk!r}")
        from .recipients import check_settings

        check_settings(self.section("postprocess"), where)
        try:
            parse_rules(self.data.get("actions", []))
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    @property
    def core(self) -> dict[str, Any]:
        return self.data["core"]  # type: ignore[no-any-return]

    @property
    def actions(self) -> tuple[Rule, ...]:
        """The action table, checked (a malformed rule was refused when the settings were loaded)."""
        return parse_rules(self.data.get("actions", []))

    @property
    def retry(self) -> dict[str, Any]:
        return self.data["retry"]  # type: ignore[no-any-return]

    def section(self, name: str) -> dict[str, Any]:
        """One table (``service``, ``workflow``...) with the defaults filled in."""
        return dict(self.data.get(name, {}))

    def backend(self, name: str) -> dict[str, Any]:
        return dict(self.data.get("backends", {}).get(name, {}))
