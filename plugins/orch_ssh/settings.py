"""``Backend("ssh", ...)`` settings: parsed and checked once, at ``add()``.

Checking here (not at the first connection) is what makes a typo in a
host, a missing key file or a relative work dir a :class:`SettingsError`
naming the field when the job is added, instead of a run failing minutes
later. The normalised settings are plain JSON values, because the
repository stores them with the job.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.plugin import SettingsError

#: The settings ``Backend("ssh", ...)`` takes.
FIELDS = ("hosts", "host", "user", "port", "key", "workdir", "slots", "known_hosts")
DEFAULT_SLOTS = 4
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
_HOST = re.compile(r"^(?:(?P<user>[^@\s:/]+)@)?(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._-]+))"
                   r"(?::(?P<port>\d{1,5}))?$")


@dataclass(frozen=True, slots=True)
class HostSpec:
    """One remote account: ``user@host:port``."""

    user: str
    host: str
    port: int

    @property
    def label(self) -> str:
        """The canonical ``user@host:port`` form (IPv6 addresses in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user}@{host}:{self.port}"


def parse_host(text: str, *, user: str | None = None, port: int = 22) -> HostSpec:
    """``[user@]host[:port]`` (``[v6addr]:port`` for IPv6); raise ``ValueError`` if malformed."""
    m = _HOST.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"{text!r} is not [user@]host[:port]")
    p = int(m["port"]) if m["port"] else port
    if not 0 < p < 65536:
        raise ValueError(f"{text!r}: port {p} is out of range")
    return HostSpec(m["user"] or user or getpass.getuser(), m["v6"] or m["name"], p)


def _path(field: str, value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or "\0" in value or "\n" in value:
        raise SettingsError(field, f"{field} must be the path of {what}")
    path = os.path.abspath(os.path.expanduser(value))
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise SettingsError(field, f"{field}: {value} is not a readable file")
    return path


def validate(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Check ``Backend("ssh", **settings)``; return them normalised, or raise :class:`SettingsError`.

    Normal form: ``hosts`` a list of ``user@host:port`` labels, ``key`` an
    absolute path or absent, ``workdir`` an absolute remote path, ``slots``
    an int, ``known_hosts`` an absolute path, absent (``~/.ssh/known_hosts``
    at connection time) or ``None`` (no host-key checking: only when asked).
    """
    for name in settings:
        if name not in FIELDS:
            raise SettingsError(name, f"backend 'ssh' takes no setting {name!r} (it takes {', '.join(FIELDS)})")
    out: dict[str, Any] = {}
    user = settings.get("user")
    if user is not None and (not isinstance(user, str) or not re.fullmatch(r"[^@\s:/]+", user)):
        raise SettingsError("user", f"user must be a user name, not {user!r}")
    port = settings.get("port", 22)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise SettingsError("port", f"port must be an integer in 1..65535, not {port!r}")
    if "hosts" in settings and "host" in settings:
        raise SettingsError("host", "give either hosts=[...] or host=..., not both")
    raw = settings.get("hosts", settings.get("host"))
    field = "hosts" if "hosts" in settings else "host"
    if raw is None:
        raise SettingsError("hosts", "hosts is required: a list of 'user@host:port'")
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, (list, tuple)) or not items:
        raise SettingsError(field, f"{field} must be a non-empty list of 'user@host:port', not {raw!r}")
    labels: list[str] = []
    for item in items:
        try:
            spec = parse_host(item, user=user, port=port)
        except ValueError as exc:
            raise SettingsError(field, f"{field}: {exc}") from None
        if spec.label in labels:
            raise SettingsError(field, f"{field}: {spec.label} is listed twice")
        labels.append(spec.label)
    out["hosts"] = labels
    if settings.get("key") is not None:
        out["key"] = _path("key", settings["key"], "a private key file")
    workdir = settings.get("workdir")
    if not isinstance(workdir, str) or not workdir.startswith("/") or "\0" in workdir or "\n" in workdir:
        raise SettingsError("workdir", f"workdir must be an absolute path on the remote hosts, not {workdir!r}")
    out["workdir"] = os.path.normpath(workdir)
    slots = settings.get("slots", DEFAULT_SLOTS)
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise SettingsError("slots", f"slots must be an integer >= 1 (runs at once per host), not {slots!r}")
    out["slots"] = slots
    if "known_hosts" in settings:
        kh = settings["known_hosts"]
        out["known_hosts"] = None if kh is None else _path("known_hosts", kh, "a known_hosts file")
    return out


def known_hosts_of(settings: Mapping[str, Any]) -> str | None:
    """The known_hosts file to check host keys against; ``None`` only when the settings say so."""
    if "known_hosts" in settings:
        value = settings["known_hosts"]
        return None if value is None else str(value)
    return os.path.expanduser(DEFAULT_KNOWN_HOSTS)
