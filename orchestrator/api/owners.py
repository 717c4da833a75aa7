"""Owners: whose each top-level job is, and who is asking.

Every top-level job belongs to the OS user of the client that added it: the
process's own user for an orchestrator opened here; for a service, the user
its Unix socket's peer credentials name, or the one a TCP token was given to
(:mod:`orchestrator.service.access`). The name is kept in the job's stored
definition under ``owner``, so it survives reopening on any repository; a
subjob, a pre-job and an aggregator are their master's. A job stored before
owners existed belongs to the home's owner.

A :class:`Caller` sees and acts on its own jobs; an admin on every job.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..core.errors import NotOwnerError
from ..core.ids import FQID, Runs, fqid_str

#: The key of a top-level job's stored definition that names its owner.
OWNER_KEY = "owner"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: an OS user's name (or a TCP token's user), and whether they may act on every job."""

    name: str
    admin: bool = False

    def may(self, owner: str) -> bool:
        return self.admin or owner == self.name


@lru_cache(maxsize=256)
def user_name(uid: int) -> str:
    """The login name of ``uid`` (its number as text when the system has no name for it)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def current_user() -> str:
    """The name of the user this process runs as."""
    return user_name(os.getuid())


def home_owner(home: Path) -> str:
    """The user who owns the home directory: the owner of jobs stored before owners existed."""
    try:
        return user_name(home.stat().st_uid)
    except OSError:
        return current_user()


class OwnerBook:
    """Each top-level job's owner, read from its definition and remembered after the job is forgotten.

    Remembered, because an observer filtering the stream of events reads a
    ``RemoveRequested`` after the job's definition is gone, and must still
    tell whose it was.
    """

    def __init__(self, specs: Mapping[int, Mapping[str, Any]], default: str) -> None:
        self._specs = specs
        self.default = default
        self._known: dict[int, str] = {}

    def owner(self, job: int) -> str | None:
        """The owner of ``job``; ``None`` for a job this home never had (or forgot before anyone asked)."""
        spec = self._specs.get(job)
        if spec is not None:
            name = spec.get(OWNER_KEY) or self.default
            self._known[job] = name
            return str(name)
        return self._known.get(job)


def refusal(fq: FQID, owner: str, caller: Caller) -> NotOwnerError:
    """The error a caller gets for acting on (or naming) another user's job."""
    return NotOwnerError(fqid_str(fq), owner=owner, user=caller.name)


def jobs_of(event: Any) -> set[int]:
    """The top-level jobs an event or change is about (none for a home-wide one such as ``Started``).

    Read from its fields, never by listing its runs: a change of a million subjobs names one job.
    """
    found: set[int] = set()
    for name in ("runs", "changed"):
        value = getattr(event, name, None)
        if isinstance(value, Runs):
            found.add(value.job)
        elif isinstance(value, tuple):
            found.update(int(fq[0]) for fq in value)
    for name in ("job", "master"):
        value = getattr(event, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            found.add(value)
    found.update(int(fq[0]) for fq in getattr(event, "targets", ()) or ())
    found.update(r.runs.job for r in getattr(event, "reports", ()) or ())
    return found


def visible_to(caller: Caller, owners: Callable[[int], str | None]) -> Callable[[Any], bool]:
    """A filter of events: those about the caller's jobs only (every event for an admin)."""
    if caller.admin:
        return lambda event: True

    def visible(event: Any) -> bool:
        return all(owners(job) == caller.name for job in jobs_of(event))

    return visible


__all__ = ["OWNER_KEY", "Caller", "OwnerBook", "current_user", "home_owner", "jobs_of", "refusal", "user_name",
           "visible_to"]
