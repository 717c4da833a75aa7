"""A value the repository refuses stops the writing of one job, never of the home. The writer put a refused flush
back whole and tried it again at the next one, so one job's refused value left every other job's changes unwritten
for good (the values known to do that are checked before they are stored: ``test_repository_text.py``; these
tests make the repository refuse with a trigger, as a constraint or a value past its limits would). A refused
flush is now written again job by job: the refused job's changes are left out, said in the log and counted; the
other jobs' are written; and the refused job's next change writes all of it again."""

from __future__ import annotations

import sqlite3
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from structlog.testing import capture_logs

from orchestrator import ArgSplitter, Executable, Job, Orchestrator

pytestmark = pytest.mark.anyio

REFUSED = "refused by a test trigger"
SAID = "the repository refused a job's changes"


def refuse_in_sqlite(home: Path, name: str = "refused") -> None:
    """Any change of the status of the job named ``name`` is refused, as a constraint would refuse it."""
    with sqlite3.connect(home / "repository.sqlite") as db:
        db.execute(f"CREATE TRIGGER refuse BEFORE UPDATE ON jobs WHEN NEW.name = '{name}' AND NEW.status != "
                   f"OLD.status BEGIN SELECT RAISE(ABORT, '{REFUSED}'); END")


def allow_in_sqlite(home: Path) -> None:
    with sqlite3.connect(home / "repository.sqlite") as db:
        db.execute("DROP TRIGGER refuse")


def two_runs(name: str) -> Job:
    return Job(name=name, application=Executable("/bin/true"), splitter=ArgSplitter([[], []]), backend="local")


def refusals(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if SAID in str(e.get("event"))]


async def run_both(orch: Orchestrator, refuse: Any) -> None:
    refused = await orch.jobs.add(Job(name="refused", application=Executable("/bin/true"), backend="local"))
    kept = await orch.jobs.add(two_runs("kept"))
    await refuse()
    for job in (refused, kept):
        await job.submit()
    for job in (refused, kept):
        await job.wait(timeout=30)
    assert [j.status.value for j in (refused, kept)] == ["completed", "completed"]


async def test_a_job_the_sqlite_repository_refuses_leaves_the_other_jobs_written(tmp_path: Path) -> None:
    home = tmp_path / "home"

    async def refuse() -> None:
        refuse_in_sqlite(home)

    with capture_logs() as logs:
        async with Orchestrator(home=home) as orch:
            await run_both(orch, refuse)
    said = refusals(logs)
    assert said and {e["fqid"] for e in said} == {"0"}, logs
    assert all(REFUSED in e["error"] and e["log_level"] == "error" for e in said)
    async with Orchestrator(home=home) as orch:  # what the repository kept: all of "kept", nothing of "refused"
        assert [(j.name, j.status.value) for j in orch.jobs] == [("refused", "new"), ("kept", "completed")]
        assert [s.status.value for s in orch.jobs[1].subjobs] == ["completed", "completed"]
    allow_in_sqlite(home)


async def test_a_refused_jobs_next_change_writes_all_of_it_again(tmp_path: Path) -> None:
    home = tmp_path / "home"

    async def refuse() -> None:
        refuse_in_sqlite(home)

    async with Orchestrator(home=home) as orch:
        await run_both(orch, refuse)
        allow_in_sqlite(home)  # the repository takes it again (a constraint dropped, a limit raised)
        orch.jobs[0].metadata = {"looked": "at"}  # a change of the job's own: its row and all its runs written
    async with Orchestrator(home=home) as orch:
        refused = orch.jobs[0]
        assert (refused.name, refused.status.value, refused.metadata) == ("refused", "completed", {"looked": "at"})


async def test_a_job_the_postgresql_repository_refuses_leaves_the_other_jobs_written(tmp_path: Path,
                                                                                      pg_url: str) -> None:
    config = {"repository": {"url": pg_url}}

    async def refuse() -> None:
        conn = await asyncpg.connect(pg_url)
        try:
            await conn.execute(f"""
                CREATE FUNCTION orchestrator.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF NEW.name = 'refused' AND NEW.status IS DISTINCT FROM OLD.status THEN
                        RAISE EXCEPTION '{REFUSED}';
                    END IF;
                    RETURN NEW;
                END $$;
                CREATE TRIGGER refuse BEFORE UPDATE ON orchestrator.jobs
                    FOR EACH ROW EXECUTE FUNCTION orchestrator.refuse();""")
        finally:
            await conn.close()

    with capture_logs() as logs:
        async with Orchestrator(home=tmp_path / "home", config=config) as orch:
            await run_both(orch, refuse)
    said = refusals(logs)
    assert said and {e["fqid"] for e in said} == {"0"} and all(REFUSED in e["error"] for e in said), logs
    async with Orchestrator(home=tmp_path / "home", config=config) as orch:
        assert [(j.name, j.status.value) for j in orch.jobs] == [("refused", "new"), ("kept", "completed")]
