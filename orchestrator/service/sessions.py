"""Sessions of the status page's browsers: what the cookie holds instead of the token.

``/?token=...`` (or ``/job/ID?token=...``) checks the token once and opens a
session: a random id (256 bits) that the browser keeps in an ``HttpOnly;
SameSite=Strict; Path=/`` cookie named ``orch_session_<port>``, and a CSRF
token, random too, that the page keeps in its origin's storage (which,
unlike a cookie, another port of the same host cannot read). A request
authenticated by the cookie needs both, except the page's HTML, which holds
no data. The session stands for the credential it was opened with: a token
revoked, or a user no longer named by the settings, ends it at once.

Sessions are kept in ``<home>/service/sessions`` (mode 0600), the ids only as
their SHA-256, so that a restarted service keeps its users logged in.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from ..plugin.logs import get_logger

log = get_logger(component="sessions")

#: Most sessions kept; the oldest go first.
MAX_SESSIONS = 1000
#: Most sessions one credential (a token) keeps; its oldest go first. Without it, one user who logged in a
#: thousand times pushed every other user's session out.
MAX_PER_CREDENTIAL = 20


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Session:
    #: The SHA-256 of the token the session was opened with.
    credential: str
    csrf: str
    expires: float


class Sessions:
    """See the module docstring; ``lifetime`` in seconds."""

    def __init__(self, path: Path, lifetime: float) -> None:
        self.path = path
        self.lifetime = lifetime
        self._by_id: dict[str, Session] | None = None

    def _all(self) -> dict[str, Session]:
        if self._by_id is None:
            self._by_id = {}
            try:
                if self.path.stat().st_mode & 0o077:
                    log.warning("sessions ignored: others may read the file", path=str(self.path))
                    return self._by_id
                data = json.loads(self.path.read_text(encoding="utf-8"))
                self._by_id = {k: Session(str(v["credential"]), str(v["csrf"]), float(v["expires"]))
                               for k, v in data.items()}
            except FileNotFoundError:
                pass
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.warning("sessions unreadable; starting without", path=str(self.path),
                            error=type(exc).__name__)
        return self._by_id

    def open(self, credential: str) -> tuple[str, Session]:
        """A new session for the token whose SHA-256 is ``credential``: its id (for the cookie) and itself."""
        sid = secrets.token_urlsafe(32)
        session = Session(credential, secrets.token_urlsafe(32), time.time() + self.lifetime)
        now = time.time()
        kept = {k: s for k, s in self._all().items() if s.expires > now}
        mine = sorted((s.expires, k) for k, s in kept.items() if s.credential == credential)
        for _, old in mine[:max(len(mine) - MAX_PER_CREDENTIAL + 1, 0)]:
            del kept[old]
        kept[digest(sid)] = session
        if len(kept) > MAX_SESSIONS:
            kept = dict(sorted(kept.items(), key=lambda kv: kv[1].expires)[-MAX_SESSIONS:])
        self._by_id = kept
        self._write()
        return sid, session

    def find(self, sid: str) -> Session | None:
        session = self._all().get(digest(sid))
        return session if session is not None and session.expires > time.time() else None

    def _write(self) -> None:
        """Written whole to a new 0600 file, then renamed over the old one."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({k: {"credential": s.credential, "csrf": s.csrf, "expires": s.expires}
                       for k, s in (self._by_id or {}).items()}, f)
        tmp.replace(self.path)
