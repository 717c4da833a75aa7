"""What an orchestrator left behind, read through the public API as a reader does
(``Orchestrator(home, readonly=True)``: no lock, nothing runs, nothing changes, whoever holds the home; a
shared repository's database is read without taking its lease)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from orchestrator import Orchestrator
from orchestrator.runtime.config import Config
from orchestrator.runtime.storage import Storage


async def home_key(home: Path) -> str:
    """The prefix of the home's idempotency keys (a shared repository's, for every home on it): no API says
    it, so it is read where the runtime keeps it."""
    storage = Storage.of(home, Config.load(home).section("repository"))
    repo = storage.repository()
    await repo.open(readonly=storage.shared)
    try:
        return await repo.home_key()
    finally:
        await repo.close()


def jobs_and_subjobs(home: Path) -> tuple[dict[int, str], dict[int, dict[int, tuple[str, dict[str, Any]]]]]:
    """job id -> status; master -> index -> (status, info with its submit_counter) (outside an event loop)."""
    return anyio.run(read_jobs_and_subjobs, home)


async def read_jobs_and_subjobs(home: Path) -> tuple[dict[int, str], dict[int, dict[int, tuple[str, dict[str, Any]]]]]:
    """The same, from inside an event loop."""
    jobs: dict[int, str] = {}
    subjobs: dict[int, dict[int, tuple[str, dict[str, Any]]]] = {}
    async with Orchestrator(home=home, readonly=True, service=False) as orch:
        for job in orch.jobs:
            assert job.id is not None
            jobs[job.id] = job.status.value
            if len(job.subjobs):
                subjobs[job.id] = {i: (s.status.value, s.info.to_dict()) for i, s in enumerate(job.subjobs)}
    return jobs, subjobs
