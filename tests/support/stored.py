"""What an orchestrator left on disk, read through the public API as a reader does
(``Orchestrator(home, readonly=True)``: no lock, nothing runs, nothing changes, whoever holds the home)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio

from orchestrator import Orchestrator


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
