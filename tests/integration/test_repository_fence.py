"""The fence of a shared repository, at the repository itself: a writer that lost the lease cannot write.

Two repositories on one real PostgreSQL database stand for two processes.
The first holds the lease; its lease is made to expire (as it would while
its process is frozen) and the second takes it over. From then on the
database refuses every write of the first (its fencing token is no longer
the current one), and what it would have written is left as it was; the
first learns that it lost the lease, and refuses to let a run go to a
backend. A write that shows no token at all is refused too.
"""

from __future__ import annotations

import anyio
import asyncpg
import pytest

from orchestrator.core.errors import RepositoryHeldError
from orchestrator.runtime.postgres.repository import PgRepository
from orchestrator.runtime.repository import RunsRow, Save, TopRow

pytestmark = pytest.mark.anyio


def job_row(job: int, status: str = "new") -> tuple[TopRow, RunsRow]:
    spec = {"application": {"exe": "/bin/true"}, "backend": {"name": "sim"}}
    runs = RunsRow(job, bytes([0]), bytes(4), {k: bytes(8) for k in ("submitting", "submitted", "running", "final")})
    return TopRow(job, f"j{job}", status, spec, None, {"top": {}}, 0, 1.0), runs


async def rows(url: str) -> list[tuple[object, ...]]:
    conn = await asyncpg.connect(url)
    try:
        return [tuple(r) for r in await conn.fetch("SELECT id, name, status, info FROM orchestrator.jobs ORDER BY id")]
    finally:
        await conn.close()


async def take_over_expired(url: str, repo: PgRepository) -> None:
    """What a frozen holder's lease comes to: its expiry passes (here at once, by the database's clock), and
    ``repo`` takes it over. The holder here is not frozen: it may renew in between, so it is tried again."""
    conn = await asyncpg.connect(url)
    try:
        for _ in range(100):
            await conn.execute("UPDATE orchestrator.lease SET expires = now() - interval '1 second'")
            try:
                await repo.open()
                return
            except RepositoryHeldError:
                await anyio.sleep(0.01)
        raise AssertionError("the expired lease could not be taken over")
    finally:
        await conn.close()


async def test_a_writer_that_lost_the_lease_is_refused_by_the_database(pg_url: str) -> None:
    first = PgRepository(pg_url, holder="first", lease_seconds=2)  # renewed every 0.4 s
    await first.open()
    try:
        await first.add_job(*job_row(0))
        second = PgRepository(pg_url, holder="second", lease_seconds=30)
        with pytest.raises(RepositoryHeldError, match="in use by first"):
            await second.open()  # held, alive, not expired: refused, naming the holder
        await take_over_expired(pg_url, second)
        try:
            assert await first.home_key() == await second.home_key()  # one key prefix for every home
            before = await rows(pg_url)
            top, runs = job_row(0, "submitted")
            with pytest.raises(RepositoryHeldError, match="refused this write: write refused: fencing token"):
                await first.save(Save(tops=[top], runs=[runs]))
            with pytest.raises(RepositoryHeldError, match="refused this write"):
                await first.add_job(*job_row(1))
            assert await rows(pg_url) == before  # nothing of either write is there

            with anyio.fail_after(5):  # its next renewal finds another token: the lease is lost
                assert await first.lost() == "another orchestrator took its lease over"
            with pytest.raises(RepositoryHeldError, match="another orchestrator took its lease over"):
                await first.confirm_writer()  # nothing more goes to a backend

            await second.save(Save(tops=[top], runs=[runs]))  # the holder writes
            assert [r[2] for r in await rows(pg_url)] == ["submitted"]
        finally:
            await second.close()
    finally:
        await first.close()


async def test_a_write_that_shows_no_token_is_refused(pg_url: str) -> None:
    repo = PgRepository(pg_url, holder="holder", lease_seconds=30)
    await repo.open()
    try:
        await repo.add_job(*job_row(0))
        conn = await asyncpg.connect(pg_url)
        try:
            with pytest.raises(asyncpg.PostgresError, match="fencing token none is not the current one") as caught:
                await conn.execute("UPDATE orchestrator.jobs SET status = 'failed'")
            assert caught.value.sqlstate == "OR001"
            with pytest.raises(asyncpg.PostgresError, match="fencing token"):
                await conn.execute("DELETE FROM orchestrator.subjobs")
        finally:
            await conn.close()
        assert [r[2] for r in await rows(pg_url)] == ["new"]
    finally:
        await repo.close()


async def test_a_lease_given_back_is_taken_at_once_and_the_schema_made_once(pg_url: str) -> None:
    """Two open a new database together: one schema, one holder; closing gives the lease back."""
    a = PgRepository(pg_url, holder="a", lease_seconds=30)
    b = PgRepository(pg_url, holder="b", lease_seconds=30)
    results = []

    async def opening(repo: PgRepository) -> None:
        try:
            await repo.open()
            results.append(repo.holder)
        except RepositoryHeldError:
            results.append("held")

    async with anyio.create_task_group() as tg:
        tg.start_soon(opening, a)
        tg.start_soon(opening, b)
    assert sorted(results) in (["a", "held"], ["b", "held"])
    holder, other = (a, b) if results.count("a") else (b, a)
    assert await holder.schema_version() == 1
    await holder.close()
    await other.open()  # given back: no waiting for the expiry
    await other.close()
