"""Which failures of a write are the repository refusing the values (the writer leaves that job's changes out
and writes the others') and which are the store's fault (the flush is kept whole, to be written later):
``tests/integration/test_repository_refusals.py`` has the writer's side."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import pytest

from orchestrator.core.errors import RepositoryHeldError
from orchestrator.runtime import sqlite as sqlite_helpers
from orchestrator.runtime.postgres.repository import refuses as pg_refuses

REFUSED = "refused by a test trigger"


def test_what_counts_as_a_refusal_and_what_as_the_stores_fault(tmp_path: Path) -> None:
    """Only a refusal of the values is left out; a fault of the store (busy, read-only, closed) keeps the flush
    to be written whole later, as before."""
    path = tmp_path / "r.sqlite"
    db = sqlite3.connect(path, timeout=0)
    db.execute("CREATE TABLE t (v TEXT CHECK (v != 'no'))")
    db.commit()
    refused: list[BaseException] = []
    for sql, args in (("INSERT INTO t VALUES (?)", ("no",)),  # a constraint
                      ("SELECT json(?)", ('{"x": NaN}',)),  # SQLite's JSON functions: "malformed JSON"
                      ("INSERT INTO t VALUES (?)", ("\udcff",)),  # a lone surrogate
                      ("INSERT INTO t VALUES (?)", (1 << 70,))):  # past 64 bits
        with pytest.raises(Exception) as caught:
            db.execute(sql, args)
        refused.append(caught.value)
    assert [sqlite_helpers.refuses(e) for e in refused] == [True] * 4, refused
    db.rollback()
    other = sqlite3.connect(path, timeout=0)
    other.execute("BEGIN IMMEDIATE")
    faults: list[BaseException] = []
    with pytest.raises(sqlite3.OperationalError) as busy:  # "database is locked"
        db.execute("BEGIN IMMEDIATE")
    faults.append(busy.value)
    other.rollback()
    other.close()
    db.close()
    with pytest.raises(sqlite3.ProgrammingError) as closed:  # "Cannot operate on a closed database"
        db.execute("SELECT 1")
    faults.append(closed.value)
    path.chmod(0o444)
    readonly = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as ro:  # "attempt to write a readonly database"
        readonly.execute("INSERT INTO t VALUES ('x')")
    faults.append(ro.value)
    readonly.close()
    assert [sqlite_helpers.refuses(e) for e in faults] == [False] * 3, faults
    assert pg_refuses(asyncpg.exceptions.CharacterNotInRepertoireError("invalid byte sequence: 0x00"))
    assert pg_refuses(asyncpg.exceptions.RaiseError(REFUSED))
    assert not pg_refuses(asyncpg.exceptions.AdminShutdownError("terminating connection"))
    assert not pg_refuses(asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"))
    assert not pg_refuses(asyncpg.exceptions.InsufficientPrivilegeError("permission denied"))
    assert not pg_refuses(RepositoryHeldError("the repository refused this write: fencing token 3 is not the "
                                              "current one (4)"))  # taken over: this process writes no more
