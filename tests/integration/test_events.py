"""The bus carries every request and every report, and each change names the stimulus that caused it.

docs/design.md "Shape": API calls become request events on the bus, drivers' answers come back as
outcome events, and the state machine's changes (``StatusChanged``) carry the ``stimulus_id`` of the
event that caused them. Observed here through ``orch.events()``, embedded and through a service.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from transports import collect_events

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator
from orchestrator.core.events import (
    KillOutcomes,
    KillRequested,
    ResubmitRequested,
    StatusChanged,
    SubmitOutcomes,
    SubmitRequested,
)

pytestmark = pytest.mark.anyio


def changes_of(events: list[Any], fq: tuple[int | None, ...]) -> list[tuple[str, str, str]]:
    """``(old, new, stimulus_id)`` of every change of ``fq``, in order."""
    return [(e.old.value, e.new.value, e.stimulus_id) for e in events
            if isinstance(e, StatusChanged) and fq in e.ids]


async def test_requests_outcomes_and_changes_in_order_with_their_stimulus(api_home: Path) -> None:
    job = Job(name="traced", application=Executable("/bin/true"),
              splitter=ArgSplitter([[str(i)] for i in range(4)]),
              backend=Backend("sim", bulk=False, fail_submit=[1], run_seconds=0.05, queued={2: 60}))
    seen: list[Any] = []

    def resubmitted(events: list[Any]) -> bool:
        sid = next((e.stimulus_id for e in events if isinstance(e, ResubmitRequested)), None)
        return sid is not None and any(isinstance(e, StatusChanged) and (j.id, 2) in e.ids and e.stimulus_id == sid
                                       and e.new.value == "submitted" for e in events)

    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(job)
        opened = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect_events, orch, seen, resubmitted, opened)
            await opened.wait()
            await anyio.sleep(0.2)  # through a service: the stream's subscription is made
            await j.submit(keep_going=True)
            with anyio.fail_after(20):
                while j.subjobs[2].status != "submitted":
                    await anyio.sleep(0.05)
            await j.subjobs[2].kill()
            await j.subjobs[2].resubmit()
            with anyio.fail_after(20):
                while not resubmitted(seen):
                    await anyio.sleep(0.05)
        await j.kill()

    submit = [e for e in seen if isinstance(e, SubmitRequested)]
    kill = [e for e in seen if isinstance(e, KillRequested)]
    resubmit = [e for e in seen if isinstance(e, ResubmitRequested)]
    assert len(submit) == len(kill) == len(resubmit) == 1
    sids = [submit[0].stimulus_id, kill[0].stimulus_id, resubmit[0].stimulus_id]
    assert len(set(sids)) == 3, sids
    s_sid, k_sid, r_sid = sids

    # Requests come before what they cause, in the order they were made.
    order = [seen.index(submit[0]), seen.index(kill[0]), seen.index(resubmit[0])]
    assert order == sorted(order)

    # Every change carries the stimulus id of the event just before it on the bus: the one it came from.
    last_cause: str | None = None
    for ev in seen:
        if isinstance(ev, StatusChanged):
            assert ev.stimulus_id == last_cause, (ev, last_cause)
        else:
            last_cause = ev.stimulus_id

    # Subjob 1's submission is refused (emulated bulk, keep_going): it goes back to new, by the submit's outcomes.
    outcomes = [e for e in seen if isinstance(e, SubmitOutcomes) and e.stimulus_id == s_sid]
    assert outcomes, "the driver's answers to the submit are events on the bus"
    assert changes_of(seen, (j.id, 1)) == [("new", "submitting", s_sid), ("submitting", "new", s_sid)]
    assert changes_of(seen, (j.id, 0))[:2] == [("new", "submitting", s_sid), ("submitting", "submitted", s_sid)]

    # Subjob 2: submitted by the submit, killed by the kill (after the driver answered), resubmitted.
    two = changes_of(seen, (j.id, 2))
    assert two[:2] == [("new", "submitting", s_sid), ("submitting", "submitted", s_sid)]
    assert ("submitted", "killed", k_sid) in two
    killed_at = next(i for i, e in enumerate(seen) if isinstance(e, StatusChanged) and (j.id, 2) in e.ids
                     and e.new.value == "killed")
    assert any(isinstance(e, KillOutcomes) and e.stimulus_id == k_sid for e in seen[:killed_at])
    assert two[-2:] == [("killed", "submitting", r_sid), ("submitting", "submitted", r_sid)]

