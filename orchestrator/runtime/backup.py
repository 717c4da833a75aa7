"""``orchestrator backup``: a consistent copy of a home's databases, taken while the home is in use.

The copy is made with SQLite's online backup API from a read-only
connection: in WAL mode a reader neither waits for nor blocks the writer, so
a service (or any process) may go on writing the home meanwhile, and the
copy is the database as one transaction left it. Each copy is written under
a temporary name, checked with ``PRAGMA quick_check``, and only then given
its name; a copy that fails the check is removed and the command fails.

A backup is a directory holding ``repository.sqlite`` and, when the home has
one, ``workflows.sqlite``, each a single self-contained file. To restore:
stop whatever uses the home and copy them back into it. Opening the backup
directory itself as a home (``--home PATH``, ``Orchestrator(home=PATH)``)
shows its jobs without touching the original. The job directories and
their outputs (``workspace/``) are not part of it.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import RepositoryError
from . import sqlite

#: The home's database files, in the order they are copied.
FILES = ("repository.sqlite", "workflows.sqlite")
#: Milliseconds a copy waits for a lock it needs (a checkpoint under way, a file being created).
BUSY_MS = 10_000


@dataclass(frozen=True, slots=True)
class Copied:
    """One file backed up: where from, where to, its size, and its jobs (``None``: not a job repository)."""

    source: Path
    target: Path
    size: int
    jobs: int | None


def backup(home: Path, target: Path, *, force: bool = False) -> list[Copied]:
    """Copy ``home``'s databases into the directory ``target`` (created); see the module docstring.

    Refused (:class:`RepositoryError`, nothing written) when the home has no repository, when ``target``
    is the home or a file, or when it holds a backup already and ``force`` is false.
    """
    home, target = home.expanduser().resolve(), target.expanduser().resolve()
    if not (home / FILES[0]).is_file():
        raise RepositoryError(f"{home} has no {FILES[0]}: nothing to back up", path=str(home / FILES[0]))
    if target == home:
        raise RepositoryError(f"{target} is the home itself: give another directory for the backup", path=str(target))
    if target.exists() and not target.is_dir():
        raise RepositoryError(f"{target} exists and is not a directory: a backup is a directory", path=str(target))
    there = [target / name for name in FILES if (target / name).exists()]
    if there and not force:
        raise RepositoryError(f"{there[0]} exists: give --force to replace it", path=str(there[0]))
    created = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    try:
        copied = [_copy(home / name, target / name) for name in FILES if (home / name).is_file()]
    except BaseException:
        if created and not any(target.iterdir()):
            target.rmdir()
        raise
    for name in FILES:  # a replaced backup keeps no file the home does not have
        if not (home / name).is_file():
            (target / name).unlink(missing_ok=True)
    return copied


def _copy(source: Path, target: Path) -> Copied:
    partial = target.with_name(f".{target.name}.partial")
    partial.unlink(missing_ok=True)
    try:
        with sqlite.guarded(source):
            src = sqlite3.connect(f"{source.as_uri()}?mode=ro", uri=True, timeout=BUSY_MS / 1000)
            try:
                dst = sqlite3.connect(partial, isolation_level=None)
                try:
                    src.backup(dst)
                    dst.execute("PRAGMA journal_mode=DELETE")  # one file, no -wal beside it
                    problems = [str(row[0]) for row in dst.execute("PRAGMA quick_check")]
                    jobs = _jobs(dst) if problems == ["ok"] else None
                finally:
                    dst.close()
            finally:
                src.close()
        if problems != ["ok"]:
            raise RepositoryError(
                f"the copy of {source} fails SQLite's quick_check ({'; '.join(problems[:3])}): {source} itself is "
                f"damaged; keep an older backup, or try 'sqlite3 {source} .recover'", path=str(source))
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return Copied(source, target, target.stat().st_size, jobs)


def _jobs(db: sqlite3.Connection) -> int | None:
    try:
        row = db.execute("SELECT COUNT(*) FROM jobs").fetchone()
    except sqlite3.OperationalError:  # no jobs table: the workflow store
        return None
    return int(row[0])
