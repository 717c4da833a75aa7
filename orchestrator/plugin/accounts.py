"""Doing a run's work as its owner (``RunSpec.owner``), for backends whose commands or logins act for a user.

A service that admits users other than its own runs as root and does
everything for a user with that user's uid, gid and groups (docs/design.md,
"Trust"). :func:`account_of` says whether a run's owner is someone else than
this process's user (else there is nothing to switch); :func:`read_as` reads
a file with the owner's rights (an ssh key, a known_hosts file: a file the
owner cannot read is refused, whatever root could read); :func:`run_as` runs
a command as the owner (``sbatch``, ``scancel``...), and
:func:`spawn_kwargs` gives the arguments that make a ``subprocess`` start as
the owner.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class AccountError(RuntimeError):
    """The owner has no account here, or this process may not act as them; the message names the user."""


@dataclass(frozen=True, slots=True)
class Account:
    """An OS user to act as: name, ids, supplementary groups, home directory."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def expand(self, path: str) -> str:
        """``~`` and ``~/...`` as this user's home (``~other/...`` is left to the system's lookup)."""
        if path == "~" or path.startswith("~/"):
            return self.home + path[1:]
        return os.path.expanduser(path) if path.startswith("~") else path


def me() -> str:
    """The name of this process's (effective) user."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def account_of(owner: str | None) -> Account | None:
    """The account to act as for a run of ``owner``; ``None`` when it is this process's own user (or no one).

    Raises :class:`AccountError` when ``owner`` has no account here, or when this process, not root, would have
    to act as someone else.
    """
    if owner is None or owner == me():
        return None
    try:
        entry = pwd.getpwnam(owner)
    except KeyError:
        raise AccountError(f"user {owner} has no account on this machine") from None
    if os.geteuid() != 0:
        raise AccountError(f"this service runs as {me()}, not root: it cannot act as {owner}")
    groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir)


def spawn_kwargs(account: Account | None) -> dict[str, Any]:
    """``subprocess`` arguments that start a process as ``account`` (none for this process's own user)."""
    if account is None:
        return {}
    return {"user": account.uid, "group": account.gid, "extra_groups": list(account.groups)}


def argv_as(account: Account | None) -> list[str]:
    """A prefix that runs a command as ``account`` (``setpriv``: its uid, gid and groups); empty for oneself.

    For a command run through a seam that takes argument lists (a batch system's runner), not a shell string.
    """
    if account is None:
        return []
    return ["setpriv", f"--reuid={account.uid}", f"--regid={account.gid}", "--init-groups", "--"]


def give(account: Account | None, *paths: str | os.PathLike[str]) -> None:
    """Make ``paths`` (directories and files this process made for a run) ``account``'s own; nothing for oneself."""
    if account is None:
        return
    for path in paths:
        os.chown(path, account.uid, account.gid, follow_symlinks=False)


def run_as(account: Account | None, argv: Sequence[str], *, input: bytes | None = None,
           env: Mapping[str, str] | None = None, cwd: str | None = None,
           timeout: float | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` as ``account`` (blocking: call it in a worker thread), its output captured."""
    environ = dict(os.environ if env is None else env)
    if account is not None:
        environ.update(HOME=account.home, USER=account.name, LOGNAME=account.name)
    return subprocess.run(list(argv), input=input, capture_output=True, env=environ, cwd=cwd, timeout=timeout,
                          check=False, **spawn_kwargs(account))


def read_as(account: Account | None, path: str, *, limit: int = 1 << 20) -> bytes:
    """The bytes of ``path`` read with ``account``'s rights; :class:`AccountError` naming both if it cannot."""
    if account is None:
        with open(path, "rb") as f:
            return f.read(limit)
    done = run_as(account, ["head", "-c", str(limit), "--", path], timeout=30)
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().rpartition(": ")[2] or f"exit {done.returncode}"
        raise AccountError(f"{path} cannot be read by {account.name}: {why}")
    return done.stdout


__all__ = ["Account", "AccountError", "account_of", "argv_as", "give", "me", "read_as", "run_as", "spawn_kwargs"]
