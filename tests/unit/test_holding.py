"""The runs one backend holds have one owner (``runtime/holding.py``): held and let go through its calls, their
statuses the core's accepted changes only, silence noted, a run the core took out of the backend's hands kept for
its kill."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.core.statuses import JobStatus
from orchestrator.plugin.contract import RunHandle
from orchestrator.runtime.held import RunKey
from orchestrator.runtime.holding import Holding, HoldingStatistics

S = JobStatus
POLLED = {"polled": True}
REPORTED = {"polled": False}


def make(key: RunKey, backend_id: str, settings: Mapping[str, Any], status: JobStatus, attempt: int) -> RunHandle:
    fqid = f"{key[0]}" if key[1] is None else f"{key[0]}.{key[1]}"
    return RunHandle(fqid, key[1] or 0, backend_id, settings, Path("/w", fqid, "output"), status, f"k-{fqid}-{attempt}",
                     attempt, Path("/w", fqid))


def holding() -> Holding:
    return Holding(make, lambda settings: bool(settings["polled"]))


def test_runs_held_and_let_go_and_what_a_poll_asks_about() -> None:
    h = holding()
    h.hold(3, [0, 1, 2], ["a", "b", "c"], [1, 1, 1], [POLLED, POLLED, REPORTED], S.SUBMITTED)
    h.hold(5, None, ["top"], [2], [POLLED], S.RUNNING)
    assert h.statistics() == HoldingStatistics(held=4, polled=3, silent=0, lost=0)
    assert [k for k, _ in h.polled()] == [(3, 0), (3, 1), (5, None)]
    assert [x.backend_id for x in h.let_go(3, [1, 2], handles=True)] == ["b", "c"]
    assert (3, 1) not in h and (3, 0) in h and [k for k, _ in h.polled()] == [(3, 0), (5, None)]
    h.let_go(3, None)  # a master's own: none of its runs
    assert (3, 0) in h
    h.forget(5)
    assert h.statistics() == HoldingStatistics(held=1, polled=1, silent=0, lost=0)


def test_statuses_are_the_cores_accepted_changes() -> None:
    h = holding()
    h.hold(3, [0, 1], ["a", "b"], [1, 1], [POLLED, POLLED], S.SUBMITTED)
    h.accepted(3, [1, 7], S.RUNNING)  # a run not held (7) is passed over
    h.accepted(4, [0], S.RUNNING)  # and a job not held
    assert [(k, x.status) for k, x in h.polled()] == [((3, 0), S.SUBMITTED), ((3, 1), S.RUNNING)]
    assert h.started(3, None) == [(3, 1)] and h.started(3, [0]) == []
    h.accepted(3, None, S.RUNNING)  # a master's own status: none of its runs'
    assert h.started(3, None) == [(3, 1)]


def test_a_run_the_core_takes_out_of_the_backends_hands_is_kept_for_its_kill() -> None:
    h = holding()
    h.hold(3, [0, 1], ["a", "b"], [1, 1], [POLLED, POLLED], S.RUNNING)
    h.accepted(3, [0], S.FAILED)  # lost, say: the core fails it and sends its kill
    assert (3, 0) not in h and [k for k, _ in h.polled()] == [(3, 1)]
    assert h.statistics() == HoldingStatistics(held=1, polled=1, silent=0, lost=1)
    lost = h.take_lost((3, 0))
    assert lost is not None and lost.backend_id == "a" and lost.attempt == 1 and h.take_lost((3, 0)) is None
    h.accepted(3, [1], S.FAILED)
    h.hold(3, [1], ["b2"], [2], [POLLED], S.SUBMITTED)  # its retry: nothing of the attempt before stays
    assert h.take_lost((3, 1)) is None and h.statistics().held == 1


def test_silence_is_noted_until_heard() -> None:
    h = holding()
    h.hold(3, [0, 1], ["a", "b"], [1, 2], [POLLED, POLLED], S.RUNNING)
    first = h.silent([(3, 0), (3, 1), (3, 9)], 10.0)  # a run not held is not silent
    assert [(s.key, s.since, s.attempt) for s in first] == [((3, 0), 10.0, 1), ((3, 1), 10.0, 2)]
    assert [s.since for s in h.silent([(3, 0)], 12.0)] == [10.0]
    h.heard([(3, 0)])
    assert [s.since for s in h.silent([(3, 0)], 13.0)] == [13.0] and h.statistics().silent == 2
    h.let_go(3, [1])
    assert h.statistics().silent == 1
