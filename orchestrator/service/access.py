"""Who may use a service, and who each client is.

By default only the service's own user: on the Unix socket (mode 0600 in a
0700 directory, and the peer's uid checked with ``SO_PEERCRED``), and on TCP
whoever shows the token of the service's token file. For a team, the
settings ``[service] users`` and ``admins`` name more OS users: the socket
then opens to everyone (0666 in a 0711 directory) and every request's peer
uid is checked against the lists, so nobody else gets in; each user may get
a TCP token of their own (``orchestrator token USER``), kept hashed in
``<home>/service/tokens`` (mode 0600) and read again when it changes.

Each request is then one :class:`~orchestrator.api.owners.Caller`: an admin
(the service's own user, or one of ``admins``) sees and acts on every job, a
user on their own.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..api.owners import Caller, user_name
from ..api.paths import ServicePaths
from ..core.errors import ConfigError
from ..plugin.logs import get_logger
from .sessions import Sessions, digest

log = get_logger(component="access")


def _digest(token: str) -> str:
    """Tokens are random (256 bits), so one SHA-256 keeps them safe at rest; no slow hash is needed."""
    return digest(token)


def tokens_path(home: Path) -> Path:
    return ServicePaths(home).dir / "tokens"


class TokenStore:
    """Users' TCP tokens, by user name, each kept as its SHA-256 (JSON ``{"user": "hex"}``, mode 0600)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._hashes: dict[str, str] = {}

    def _read(self) -> dict[str, str]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._seen, self._hashes = None, {}
            return self._hashes
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if seen == self._seen:
            return self._hashes
        self._seen, self._hashes = seen, {}
        if st.st_mode & 0o077:
            log.warning("token store ignored: others may read it; chmod 600 it", path=str(self.path))
            return self._hashes
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("token store unreadable", path=str(self.path), error=f"{type(exc).__name__}: {exc}")
            return self._hashes
        if isinstance(data, dict):
            self._hashes = {str(k): str(v) for k, v in data.items() if isinstance(v, str)}
        return self._hashes

    def users(self) -> list[str]:
        return sorted(self._read())

    def match(self, shown: str) -> str | None:
        """The user whose token ``shown`` is; every stored hash is compared, in constant time each."""
        return self.match_digest(_digest(shown))

    def match_digest(self, hashed: str) -> str | None:
        found = None
        for user, stored in self._read().items():
            if hmac.compare_digest(hashed, stored):
                found = user
        return found

    def forget(self) -> None:
        """Read the file again at the next look, changed or not (SIGHUP)."""
        self._seen = None

    def issue(self, user: str) -> str:
        """A new token for ``user`` (replacing theirs), stored hashed; the token itself is returned, never kept."""
        token = secrets.token_urlsafe(32)
        self._write({**self._read(), user: _digest(token)})
        return token

    def revoke(self, user: str) -> bool:
        hashes = dict(self._read())
        if hashes.pop(user, None) is None:
            return False
        self._write(hashes)
        return True

    def _write(self, hashes: Mapping[str, str]) -> None:
        """Written whole to a new 0600 file, then renamed over the old one: a reader sees one or the other."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        if os.geteuid() == 0:  # root giving a token on another user's home: the file is for that user's service
            home = self.path.parent.parent.stat()
            os.fchown(fd, home.st_uid, home.st_gid)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(dict(sorted(hashes.items())), f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)
        self._seen = None


def names(settings: Mapping[str, Any], key: str) -> frozenset[str]:
    """``[service] users`` or ``admins``: a list of user names, checked."""
    value = settings.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() == v and v for v in value):
        raise ConfigError(f"service.{key} must be a list of user names (strings), not {value!r}")
    return frozenset(value)


@dataclass
class Access:
    """See the module docstring. ``owner``: the service's own user; ``token``: its token (TCP), if any."""

    owner: str
    owner_uid: int
    users: frozenset[str] = frozenset()
    admins: frozenset[str] = frozenset()
    token: str | None = None
    tokens: TokenStore | None = None
    sessions: Sessions | None = None
    #: The TCP port bound, which names the session cookie (:attr:`cookie`).
    port: int | None = None

    @classmethod
    def of(cls, settings: Mapping[str, Any], home: Path, token: str | None) -> Access:
        uid = os.getuid()
        lifetime = settings.get("session_seconds", 43200.0)
        if isinstance(lifetime, bool) or not isinstance(lifetime, (int, float)) or lifetime <= 0:
            raise ConfigError(f"service.session_seconds must be a positive number, not {lifetime!r}")
        sessions = Sessions(ServicePaths(home).dir / "sessions", float(lifetime)) if token is not None else None
        return cls(user_name(uid), uid, names(settings, "users"), names(settings, "admins"), token,
                   TokenStore(tokens_path(home)) if token is not None else None, sessions)

    def reload(self, settings: Mapping[str, Any], token: str | None) -> None:
        """SIGHUP: ``users``, ``admins``, the service's token and the users' tokens as they are now."""
        self.users, self.admins = names(settings, "users"), names(settings, "admins")
        if token is not None:
            self.token = token
        if self.tokens is not None:
            self.tokens.forget()

    @property
    def cookie(self) -> str:
        """The session cookie's name: with the port, so that two services on one host keep theirs apart."""
        return f"orch_session_{self.port}"

    @property
    def shared(self) -> bool:
        """Users besides the owner may connect: the socket is opened to them, and their uids checked."""
        return bool(self.users or self.admins)

    def named(self, name: str) -> Caller | None:
        """The caller ``name`` is, if the settings let them in."""
        if name == self.owner or name in self.admins:
            return Caller(name, admin=True)
        return Caller(name) if name in self.users else None

    def by_uid(self, uid: int | None) -> Caller | None:
        """The client at the other end of the Unix socket, by its peer uid (checked on every request)."""
        if uid is None:
            return None
        if uid == self.owner_uid:
            return Caller(self.owner, admin=True)
        name = user_name(uid)
        return self.named(name) if self.shared and name != self.owner else None

    def by_token(self, shown: str | None) -> Caller | None:
        """The client over TCP, by the token it shows: the owner's, or a user's still named by the settings."""
        if self.token is None or not shown:
            return None
        return self.by_digest(_digest(shown))

    def by_digest(self, hashed: str) -> Caller | None:
        """Who the token whose SHA-256 is ``hashed`` stands for now (``None``: revoked, or its user removed)."""
        if self.token is None:
            return None
        if hmac.compare_digest(hashed, _digest(self.token)):
            return Caller(self.owner, admin=True)
        user = self.tokens.match_digest(hashed) if self.tokens is not None else None
        return self.named(user) if user is not None else None

    def login(self, shown: str) -> tuple[str, str] | None:
        """``/?token=...``: a new session for a right token; its id and its CSRF token."""
        if self.sessions is None or self.by_token(shown) is None:
            return None
        sid, session = self.sessions.open(_digest(shown))
        return sid, session.csrf

    def by_session(self, sid: str, csrf: str | None, *, page: bool = False) -> Caller | None:
        """The browser whose cookie holds ``sid``; it must show the session's CSRF token too, but for a page."""
        session = self.sessions.find(sid) if self.sessions is not None else None
        if session is None:
            return None
        if not page and not (csrf and hmac.compare_digest(csrf.encode(), session.csrf.encode())):
            return None
        return self.by_digest(session.credential)

    def refusal(self, uid: int | None) -> str:
        """What a client the socket does not let in is told."""
        if not self.shared:
            return "only the service's owner may use its socket"
        who = f"user {user_name(uid)} (uid {uid})" if uid is not None else "this client"
        return f"{who} may not use this service: its [service] users and admins settings do not name them"
