"""The transition table, exhaustively: every (from, to) pair of docs/design.md's statuses, on a subjob and on a
job that runs itself. ``Core.move`` is the one place a run's status changes; a pair outside the table is
refused and leaves the run, its counters and its times alone."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.core.base import Core
from orchestrator.core.events import Profile
from orchestrator.core.jobs import JobState
from orchestrator.core.statuses import ALL_STATUSES, TRANSITIONS, JobStatus

S = JobStatus
DESIGN_TABLE = {
    "new": {"submitting"},
    "submitting": {"submitted", "new", "failed"},
    "submitted": {"running", "completing", "completed", "failed", "killed", "held"},
    "running": {"completing", "completed", "failed", "killed", "held"},
    "completing": {"completed", "failed"},
    "completed": {"submitting"},
    "failed": {"submitting"},
    "killed": {"submitting"},
    "held": {"submitting", "killed"},
}
PAIRS = list(itertools.product([s.value for s in ALL_STATUSES], repeat=2))


def test_the_table_is_designs() -> None:
    assert [s.value for s in ALL_STATUSES] == ["new", "submitting", "submitted", "running", "completing",
                                               "completed", "failed", "killed", "held"]
    assert {k.value: {v.value for v in vs} for k, vs in TRANSITIONS.items()} == DESIGN_TABLE


def _job(core: Core, n: int, status: JobStatus) -> JobState:
    js = JobState(0, Profile("sim", splits=n > 0), 0.0)
    if n:
        js.split(n)
    js.runs.status[:] = bytearray([status.code]) * len(js.runs)
    js.runs.counts = [0] * len(ALL_STATUSES)
    js.runs.counts[status.code] = len(js.runs)
    core.jobs[0] = js
    return js


@pytest.mark.parametrize("master", [False, True], ids=["single", "subjob"])
@pytest.mark.parametrize(("frm", "to"), PAIRS)
def test_every_pair(frm: str, to: str, master: bool) -> None:
    core = Core()
    core.now = 5.0
    js = _job(core, 3 if master else 0, S(frm))
    moved = core.move(js, [1] if master else [0], S(to), "t")
    i = 1 if master else 0
    if frm == to:
        assert moved == [] and not core.step.refusals  # no news is no move, and no refusal
    elif to in DESIGN_TABLE[frm]:
        assert moved == [i] and js.runs.get(i) == S(to)
        assert [(c.old.value, c.new.value) for c in core.step.changes] == [(frm, to)]
    else:
        assert moved == [] and js.runs.get(i) == S(frm)
        assert [r.reason for r in core.step.refusals] == [f"illegal transition {frm} -> {to}"]
        assert not core.step.changes and js.runs.timestamps(i) == {}
    assert sum(js.runs.counts) == len(js.runs) and js.runs.counts[js.runs.status[i]] >= 1


def test_forced_moves_go_outside_the_table_on_record() -> None:
    core = Core()
    js = _job(core, 0, S.NEW)
    assert core.move(js, [0], S.FAILED, "f", forced=True) == [0]
    assert core.step.changes[0].forced and js.status == S.FAILED


def test_attempts_count_submissions_and_a_rollback_uncounts_one() -> None:
    core = Core()
    js = _job(core, 2, S.NEW)
    core.move(js, [0, 1], S.SUBMITTING, "s")
    assert list(js.runs.attempt) == [1, 1]
    core.move(js, [1], S.NEW, "s")
    assert list(js.runs.attempt) == [1, 0]


def test_counters_follow_every_move_without_a_rescan() -> None:
    core = Core()
    js = _job(core, 1000, S.NEW)
    core.move(js, range(1000), S.SUBMITTING, "a")
    core.move(js, range(0, 1000, 2), S.SUBMITTED, "b")
    core.move(js, range(0, 1000, 4), S.RUNNING, "c")
    recount = [0] * len(ALL_STATUSES)
    for code in js.runs.status:
        recount[code] += 1
    assert js.runs.counts == recount
    assert js.counts() == {S.SUBMITTING: 500, S.SUBMITTED: 250, S.RUNNING: 250}
