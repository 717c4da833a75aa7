"""Reattaching at a start: the runs the backends had when the home was last closed go back to their actors.

Their processes never depended on this one: each run still submitted,
running or completing is held again by its backend's actor (compactly, as
:mod:`.held` keeps runs), from the run arrays the state machine restored and
the backend ids the repository kept; a reporting driver is handed them to
``track``, a chunk of handles at a time, so a million never exist at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..core.machine import StateMachine
from ..core.statuses import JobStatus
from .actor import Actor
from .definitions import Definitions
from .repository import Repository


async def reattach(sm: StateMachine, definitions: Definitions, repo: Repository,
                   actor_of: Callable[[str], Awaitable[Actor]]) -> None:
    for job in sm.job_ids():
        monitored = sm.monitored(job)
        if not monitored:
            continue
        master = sm.is_master(job)
        backend = sm.profile(job).backend
        actor = await actor_of(backend)
        found: list[tuple[int, str, str | None]] = []  # (index, backend id, delta)
        if master:
            rows = repo.subjob_rows(job, monitored)
            found = [(i, b, d) for i in monitored if (b := rows.get(i, (None, None))[0]) is not None
                     for d in [rows[i][1]]]
        elif (backend_id := repo.top_backend_id(job)) is not None:
            found = [(0, backend_id, None)]
        if not found:
            continue
        indexes = [i for i, _, _ in found]
        settings = definitions.held_settings(job, [delta for _, _, delta in found])
        codes = sm.statuses(job)  # a master's subjobs'; a job without subjobs is its one run ([0])
        statuses = [JobStatus.from_code(codes[i]) for i in indexes] if master else [sm.status((job,))]
        actor.holding.hold(job, indexes if master else None, [b for _, b, _ in found],
                           list(sm.attempts(job, indexes)), settings, statuses)
        driver = actor.driver
        if driver.capabilities_for(settings[0]).reports:
            for lo in range(0, len(indexes), actor.chunk):
                await driver.track(actor.holding.handles(job, indexes[lo:lo + actor.chunk] if master else None))
