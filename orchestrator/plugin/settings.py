"""Typed backend settings: a dataclass per backend, from which validation and the settings' names follow.

A driver declares its settings once::

    @dataclass(frozen=True)
    class SshSettings(Settings):
        hosts: list[str] = field(default_factory=list)
        slots: int = 4
        port: int = 22

        def check(self) -> None:          # value rules beyond the types
            if self.slots < 1:
                raise SettingsError("slots", "slots must be at least 1")

and ``Backend("ssh", hosts=[...], slots=2)`` is checked against it: an
unknown name, a value of the wrong type, or a value :meth:`Settings.check`
refuses raises :class:`SettingsError` naming the setting, which the core
turns into a ``JobError`` naming the job and ``backend.<setting>``. The
same names are the TOML keys of a job file's ``[backend]`` table and of
``[backends.<name>]`` in ``orchestrator.toml``. A driver reads its settings
typed with ``MySettings.of(run.settings)``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T", bound="Settings")


class SettingsError(ValueError):
    """A backend setting is invalid; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclasses.dataclass(frozen=True)
class Settings:
    """Base of a backend's settings; see the module docstring."""

    def check(self) -> None:
        """Rules on values (ranges, combinations); raise :class:`SettingsError` naming the setting."""

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def validate(cls, values: Mapping[str, Any], *, backend: str = "") -> dict[str, Any]:
        """The given settings, checked and normalised (defaults are not added: what is stored is what was given)."""
        hints = typing.get_type_hints(cls)
        known = cls.names()
        out: dict[str, Any] = {}
        for key, value in values.items():
            if key not in known:
                takes = f" (it takes {', '.join(sorted(known))})" if known else " (it takes none)"
                raise SettingsError(key, f"backend {backend!r} takes no setting {key!r}{takes}")
            out[key] = _coerce(key, value, hints[key])
        try:
            cls(**out).check()
        except TypeError as exc:  # a required setting missing
            raise SettingsError(next(iter(known), "settings"), str(exc)) from None
        return out

    @classmethod
    def of(cls: type[T], values: Mapping[str, Any]) -> T:
        """The settings of a run, typed, with the defaults filled in."""
        return cls(**{k: v for k, v in values.items() if k in cls.names()})


@dataclasses.dataclass(frozen=True)
class NoSettings(Settings):
    """A backend that takes no setting."""


def _coerce(key: str, value: Any, hint: Any) -> Any:
    """``value`` as type ``hint`` (int, float, str, bool, list/tuple/dict of those, optional), or SettingsError."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(key, value, arg)
            except SettingsError as exc:
                errors.append(exc)
        raise errors[0] if errors else SettingsError(key, f"{key} has no accepted type")
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise SettingsError(key, f"{key} must be true or false, not {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingsError(key, f"{key} must be an integer, not {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingsError(key, f"{key} must be a number, not {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise SettingsError(key, f"{key} must be a string, not {value!r}")
        return value
    if origin in (list, tuple) or hint in (list, tuple):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise SettingsError(key, f"{key} must be a list, not {value!r}")
        item = args[0] if args else Any
        return [_coerce(key, v, item) for v in value]
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            raise SettingsError(key, f"{key} must be a table (a mapping), not {value!r}")
        vtype = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(key, v, vtype) for k, v in value.items()}
    return value
