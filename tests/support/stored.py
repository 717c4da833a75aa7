"""What an orchestrator stored, read with the runtime's own loader (nothing runs, nothing changes).

The home's settings say which repository: its SQLite file, or the PostgreSQL database of ``[repository]
url``, which is read without taking its lease (a service may be writing it meanwhile).
"""

from __future__ import annotations

from array import array
from pathlib import Path
from typing import Any

import anyio

from orchestrator.core.statuses import JobStatus
from orchestrator.runtime.config import Config
from orchestrator.runtime.repository import Loaded
from orchestrator.runtime.storage import Storage


async def load(home: Path) -> Loaded:
    storage = Storage.of(home, Config.load(home).section("repository"))
    repo = storage.repository()
    await repo.open(readonly=storage.shared)
    try:
        return await repo.load()
    finally:
        await repo.close()


async def home_key(home: Path) -> str:
    """The prefix of the home's idempotency keys (a shared repository's, for every home on it)."""
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
    loaded = await load(home)
    jobs = {row.id: row.status for row in loaded.tops}
    subjobs: dict[int, dict[int, tuple[str, dict[str, Any]]]] = {}
    for row in loaded.tops:
        if row.n_subjobs:
            codes = loaded.runs[row.id].status
            attempts = array("I", loaded.runs[row.id].attempt)
            extras = loaded.infos.get(row.id, {})
            subjobs[row.id] = {i: (JobStatus.from_code(c).value, {**extras.get(i, {}), "submit_counter": attempts[i]})
                               for i, c in enumerate(codes)}
    return jobs, subjobs
