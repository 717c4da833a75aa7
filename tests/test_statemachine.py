"""Pure unit tests of ``orchestrator.status`` and ``orchestrator.statemachine``: no loop, no disk.

The expected transition table and master rules are copied from DESIGN.md ("Statuses and
transitions"), never from ``status.TRANSITIONS``, so that a drift in the code fails here.
"""

from __future__ import annotations

import itertools
import random

import orchestrator.statemachine as statemachine_mod
import pytest
from orchestrator.statemachine import Change, MasterChange, Refusal, StateMachine

from orchestrator.core.ids import fqid_str, parse_fqid
from orchestrator.core.statuses import ALL_STATUSES, FINAL, JobStatus, master_status, parse_status

S = JobStatus

# DESIGN.md, "Statuses and transitions", verbatim as strings.
DESIGN_STATUSES = "new, submitting, submitted, running, completing, completed, failed, killed, held"
DESIGN_TABLE = {
    "new": "submitting",
    "submitting": "submitted, new, failed",
    "submitted": "running, completing, completed, failed, killed, held",
    "running": "completing, completed, failed, killed, held",
    "completing": "completed, failed",
    "completed": "submitting",
    "failed": "submitting",
    "killed": "submitting",
    "held": "submitting, killed",
}
EXPECTED = {frm: {t.strip() for t in to.split(",")} for frm, to in DESIGN_TABLE.items()}
NAMES = [n.strip() for n in DESIGN_STATUSES.split(",")]
PAIRS = list(itertools.product(NAMES, NAMES))


def test_status_names_match_design() -> None:
    assert [s.value for s in ALL_STATUSES] == NAMES
    assert set(EXPECTED) == set(NAMES)
    assert all(to <= set(NAMES) for to in EXPECTED.values())
    assert {s.value for s in FINAL} == {"completed", "failed", "killed"}
    assert S.FAILED == "failed" and str(S.HELD) == "held"
    assert all(S.from_code(s.code) is s for s in ALL_STATUSES)
    assert parse_status("running") is S.RUNNING
    with pytest.raises(ValueError, match="unknown status"):
        parse_status("finished")


def _check_move(sm: StateMachine, fqid: tuple[int, ...], frm: str, to: str) -> None:
    old, new = S(frm), S(to)
    assert sm.status(fqid) is old
    step = sm.move([fqid], new, 7.0)
    if to in EXPECTED[frm]:
        assert step.changes == [Change(fqid, old, new, 7.0)]
        assert step.refused == []
        assert sm.status(fqid) is new
    else:
        assert step.changes == []
        assert len(step.refused) == 1
        refusal = step.refused[0]
        assert isinstance(refusal, Refusal)
        assert (refusal.fqid, refusal.old, refusal.new) == (fqid, old, new)
        assert "illegal transition" in refusal.reason
        assert sm.status(fqid) is old


@pytest.mark.parametrize(("frm", "to"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_transition_table_toplevel_job(frm: str, to: str) -> None:
    sm = StateMachine()
    sm.add_job(5, S(frm))
    _check_move(sm, (5,), frm, to)
    assert not sm.is_master(5)


@pytest.mark.parametrize(("frm", "to"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_transition_table_subjob(frm: str, to: str) -> None:
    sm = StateMachine()
    sm.add_master(3, [S.KILLED, S(frm), S.KILLED])
    _check_move(sm, (3, 1), frm, to)
    assert sm.status((3, 0)) is S.KILLED and sm.status((3, 2)) is S.KILLED
    state = sm.master(3)
    expected_counts = [0] * len(ALL_STATUSES)
    for i in range(3):
        expected_counts[sm.status((3, i)).code] += 1
    assert state.counts == expected_counts


def test_unknown_jobs_are_refused() -> None:
    sm = StateMachine()
    sm.add_master(3, [S.SUBMITTED, S.SUBMITTED])
    for fqid in [(99,), (3, 2), (99, 0), (3, -1), (3, 0, 1)]:
        step = sm.move([fqid], S.RUNNING, 1.0)
        assert step.changes == [] and [r.reason for r in step.refused] == ["unknown job"], fqid
    assert [sm.status((3, i)) for i in range(2)] == [S.SUBMITTED, S.SUBMITTED]
    assert sm.master(3).counts[S.SUBMITTED.code] == 2


# ------------------------------------------------------------------ master rules
# (subjob statuses, expected with submitted-first, expected with running-first); each case's
# comment names the rule that is the first to match under the default order.
RULE_CASES = [
    ([S.SUBMITTED, S.RUNNING, S.HELD, S.FAILED, S.COMPLETED, S.KILLED], S.SUBMITTED, S.RUNNING),  # 1
    ([S.SUBMITTING, S.COMPLETING, S.NEW], S.SUBMITTED, S.RUNNING),  # 1, via submitting
    ([S.SUBMITTING, S.KILLED], S.SUBMITTED, S.SUBMITTED),  # 1
    ([S.RUNNING, S.HELD, S.FAILED, S.COMPLETED, S.KILLED], S.RUNNING, S.RUNNING),  # 2
    ([S.COMPLETING, S.COMPLETED], S.RUNNING, S.RUNNING),  # 2, via completing
    ([S.SUBMITTED, S.HELD, S.FAILED], S.SUBMITTED, S.SUBMITTED),  # 1; no running, so order is moot
    ([S.HELD, S.FAILED, S.NEW, S.COMPLETED, S.KILLED], S.HELD, S.HELD),  # 3
    ([S.FAILED, S.COMPLETED, S.KILLED], S.FAILED, S.FAILED),  # 4
    ([S.NEW, S.COMPLETED, S.KILLED], S.FAILED, S.FAILED),  # 4, a subjob left new
    ([S.NEW], S.FAILED, S.FAILED),  # 4
    ([S.COMPLETED, S.KILLED, S.COMPLETED], S.COMPLETED, S.COMPLETED),  # 5
    ([S.KILLED, S.KILLED], S.KILLED, S.KILLED),  # 6
]


@pytest.mark.parametrize(("subjobs", "submitted_first", "running_first"), RULE_CASES)
def test_master_rules(subjobs: list[JobStatus], submitted_first: JobStatus, running_first: JobStatus) -> None:
    counts: dict[JobStatus, int] = {}
    for s in subjobs:
        counts[s] = counts.get(s, 0) + 1
    assert master_status(counts) is submitted_first
    assert master_status(counts, "submitted-first") is submitted_first
    assert master_status(counts, "running-first") is running_first
    for order, expected in [("submitted-first", submitted_first), ("running-first", running_first)]:
        sm = StateMachine(order)
        assert sm.add_master(1, subjobs) is expected
        assert sm.status((1,)) is expected


def test_master_rules_zero_counts_are_ignored() -> None:
    assert master_status({S.SUBMITTED: 0, S.RUNNING: 0, S.COMPLETED: 2}) is S.COMPLETED


def test_subjob_left_new_makes_master_failed() -> None:
    sm = StateMachine()
    sm.split(1, 3)
    step = sm.move([(1, 0), (1, 1), (1, 2)], S.SUBMITTING, 1.0)
    assert len(step.changes) == 3
    sm.move([(1, 0), (1, 1)], S.SUBMITTED, 2.0)
    sm.move([(1, 2)], S.NEW, 2.0)  # left unsubmitted
    sm.pin(1, None, 3.0)
    sm.move([(1, 0), (1, 1)], S.COMPLETED, 4.0)
    assert sm.status((1,)) is S.FAILED
    assert not sm.master(1).all_final()


@pytest.mark.parametrize("order", ["bogus", "", "Running-First", "running_first"])
def test_invalid_order_raises(order: str) -> None:
    with pytest.raises(ValueError, match="master_status_order"):
        StateMachine(order)
    with pytest.raises(ValueError):
        master_status({S.RUNNING: 1}, order)


# ------------------------------------------------------------------ counters
@pytest.mark.parametrize("order", ["submitted-first", "running-first"])
def test_counters_are_incremental_and_match_recount(order: str) -> None:
    rng = random.Random(1234)
    n = 60
    sm = StateMachine(order)
    sm.add_master(8, [S.NEW] * n)
    shadow = ["new"] * n
    applied = refused = 0
    for t in range(3000):
        batch = rng.sample(range(n), rng.randint(1, 4))
        target = rng.choice(NAMES)
        step = sm.move([(8, i) for i in batch], S(target), float(t))
        for i in batch:
            if target in EXPECTED[shadow[i]]:
                shadow[i] = target
        applied += len(step.changes)
        refused += len(step.refused)
        assert [sm.status((8, i)).value for i in range(n)] == shadow
    assert applied > 1000 and refused > 1000
    state = sm.master(8)
    recount = [0] * len(ALL_STATUSES)
    for code in state.statuses:
        recount[code] += 1
    assert state.counts == recount
    assert [shadow.count(s.value) for s in ALL_STATUSES] == recount
    assert state.status is master_status({S(s): shadow.count(s) for s in set(shadow)}, order)


class _NoScanBytes(bytearray):
    """A status array that counts whole-array scans."""

    scans = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).scans += 1
        return super().__iter__()

    def count(self, *args):  # type: ignore[no-untyped-def]
        type(self).scans += 1
        return super().count(*args)

    def __contains__(self, item):  # type: ignore[no-untyped-def]
        type(self).scans += 1
        return super().__contains__(item)


def test_move_on_100k_master_does_not_rescan(monkeypatch: pytest.MonkeyPatch) -> None:
    n = 100_000
    statuses = _NoScanBytes(bytearray([S.SUBMITTED.code]) * n)
    sm = StateMachine()
    assert sm.add_master(2, statuses) is S.SUBMITTED
    assert sm.master(2).statuses is statuses  # used as is, not copied
    calls: list[dict[JobStatus, int]] = []

    def spy(counts, order="submitted-first"):  # type: ignore[no-untyped-def]
        calls.append(dict(counts))
        return master_status(counts, order)

    monkeypatch.setattr(statemachine_mod, "master_status", spy)
    _NoScanBytes.scans = 0

    step = sm.move([(2, 500)], S.RUNNING, 1.0)
    assert step.masters == []  # still submitted: 99,999 remain
    assert calls == [{S.SUBMITTED: n - 1, S.RUNNING: 1}]

    step = sm.move([(2, i) for i in range(n)], S.RUNNING, 2.0)  # one bulk move, one re-derivation
    assert len(step.changes) == n - 1 and len(step.refused) == 1
    assert step.masters == [MasterChange(2, S.SUBMITTED, S.RUNNING, 2.0)]
    assert calls[1:] == [{S.RUNNING: n}]

    sm.move([(2, 7)], S.FAILED, 3.0)
    assert calls[2] == {S.RUNNING: n - 1, S.FAILED: 1}
    assert _NoScanBytes.scans == 0
    assert len(calls) == 3
    assert sm.master(2).counts[S.RUNNING.code] == n - 1


# ------------------------------------------------------------------ masters: derived, pinned, ended
def test_master_cannot_be_moved() -> None:
    sm = StateMachine()
    sm.add_master(4, [S.FAILED, S.COMPLETED])
    step = sm.move([(4,)], S.SUBMITTING, 1.0)
    assert step.changes == [] and step.masters == []
    assert len(step.refused) == 1 and "derived" in step.refused[0].reason
    assert sm.status((4,)) is S.FAILED


def test_pin_shows_submitting_and_derives_on_unpin() -> None:
    sm = StateMachine()
    sm.add_job(1)
    assert sm.pin(1, S.SUBMITTING, 1.0).changes == [Change((1,), S.NEW, S.SUBMITTING, 1.0)]
    sm.split(1, 2)
    assert sm.is_master(1) and sm.status((1,)) is S.SUBMITTING
    step = sm.move([(1, 0), (1, 1)], S.SUBMITTING, 2.0)
    step.extend(sm.move([(1, 0)], S.SUBMITTED, 2.5))
    assert step.masters == [] and sm.status((1,)) is S.SUBMITTING  # pinned
    step = sm.pin(1, None, 3.0)
    assert step.masters == [MasterChange(1, S.SUBMITTING, S.SUBMITTED, 3.0)]
    assert sm.status((1,)) is S.SUBMITTED

    sm.unsplit(1)
    assert not sm.is_master(1) and sm.status((1,)) is S.NEW


def test_unpin_right_after_split_derives() -> None:
    sm = StateMachine()
    sm.split(1, 2)
    step = sm.pin(1, None, 1.0)
    assert sm.status((1,)) is S.FAILED  # all left new: rule 4, never a lingering "submitting"
    assert step.masters == [MasterChange(1, S.SUBMITTING, S.FAILED, 1.0)]


def test_pin_existing_master() -> None:
    sm = StateMachine()
    sm.add_master(6, [S.COMPLETED, S.FAILED])
    assert sm.pin(6, S.SUBMITTING, 1.0).masters == [MasterChange(6, S.FAILED, S.SUBMITTING, 1.0)]
    assert sm.move([(6, 1)], S.SUBMITTING, 2.0).masters == []
    assert sm.status((6,)) is S.SUBMITTING
    assert sm.pin(6, None, 3.0).masters == [MasterChange(6, S.SUBMITTING, S.SUBMITTED, 3.0)]


def test_ended_when_last_subjob_becomes_final() -> None:
    sm = StateMachine()
    sm.add_master(2, [S.RUNNING, S.RUNNING, S.COMPLETED])
    step = sm.move([(2, 0)], S.COMPLETED, 1.0)
    assert step.ended == [] and step.masters == []
    step = sm.move([(2, 1)], S.FAILED, 2.0)
    assert step.ended == [2]
    assert step.masters == [MasterChange(2, S.RUNNING, S.FAILED, 2.0)]
    # resubmitting one subjob reopens the master from any status; ending it again ends the master again
    step = sm.move([(2, 1)], S.SUBMITTING, 3.0)
    assert step.masters == [MasterChange(2, S.FAILED, S.SUBMITTED, 3.0)] and step.ended == []
    sm.move([(2, 1)], S.SUBMITTED, 4.0)
    assert sm.move([(2, 1)], S.COMPLETED, 5.0).ended == [2]
    assert sm.status((2,)) is S.COMPLETED


def test_not_ended_while_pinned_nor_with_new_left() -> None:
    sm = StateMachine()
    sm.add_master(2, [S.RUNNING, S.KILLED])
    sm.pin(2, S.SUBMITTING, 1.0)
    step = sm.move([(2, 0)], S.KILLED, 2.0)
    assert step.ended == [] and step.masters == []
    step = sm.pin(2, None, 3.0)
    assert step.ended == [2] and step.masters == [MasterChange(2, S.SUBMITTING, S.KILLED, 3.0)]

    sm.add_master(3, [S.NEW, S.RUNNING])
    step = sm.move([(3, 1)], S.COMPLETED, 4.0)
    assert step.ended == [] and sm.status((3,)) is S.FAILED


def test_postprocess_failed_and_reset_by_resubmit() -> None:
    sm = StateMachine()
    sm.add_master(9, [S.COMPLETED, S.COMPLETED])
    step = sm.set_postprocess_failed(9, True, 1.0)
    assert step.masters == [MasterChange(9, S.COMPLETED, S.FAILED, 1.0)] and step.ended == []
    assert sm.status((9,)) is S.FAILED and sm.master(9).postprocess_failed
    step = sm.move([(9, 0)], S.SUBMITTING, 2.0)
    assert not sm.master(9).postprocess_failed
    assert step.masters == [MasterChange(9, S.FAILED, S.SUBMITTED, 2.0)]
    sm.move([(9, 0)], S.SUBMITTED, 3.0)
    step = sm.move([(9, 0)], S.COMPLETED, 4.0)
    assert sm.status((9,)) is S.COMPLETED and step.ended == [9]
    # only a would-be completed master turns failed
    sm.add_master(10, [S.KILLED])
    assert sm.set_postprocess_failed(10, True, 5.0).masters == [] and sm.status((10,)) is S.KILLED
    assert sm.add_master(11, [S.COMPLETED], postprocess_failed=True) is S.FAILED


def test_master_timestamps() -> None:
    sm = StateMachine()
    sm.add_master(1, [S.NEW] * 3, first={"new": 1.0})
    sm.move([(1, 0)], S.SUBMITTING, 10.0)
    sm.move([(1, 1), (1, 2)], S.SUBMITTING, 5.0)
    sm.move([(1, 0)], S.SUBMITTED, 20.0)
    sm.move([(1, 1)], S.SUBMITTED, 15.0)
    sm.move([(1, 2)], S.SUBMITTED, 30.0)
    sm.move([(1, 0)], S.RUNNING, 30.0)
    sm.move([(1, 1)], S.RUNNING, 25.0)
    sm.move([(1, 0)], S.COMPLETED, 40.0)
    sm.move([(1, 1)], S.FAILED, 50.0)
    sm.move([(1, 2)], S.COMPLETED, 35.0)
    state = sm.master(1)
    assert state.first == {"new": 1.0, "submitting": 5.0, "submitted": 15.0, "running": 25.0}
    assert state.last == {"completed": 40.0, "failed": 50.0, "final": 50.0}
    sm.move([(1, 1)], S.SUBMITTING, 60.0)
    sm.move([(1, 1)], S.SUBMITTED, 61.0)
    sm.move([(1, 1)], S.KILLED, 62.0)
    assert state.first["submitting"] == 5.0 and state.first["submitted"] == 15.0
    assert state.last == {"completed": 40.0, "failed": 50.0, "killed": 62.0, "final": 62.0}


def test_refused_moves_leave_timestamps_alone() -> None:
    sm = StateMachine()
    sm.add_master(1, [S.RUNNING])
    sm.move([(1, 0)], S.SUBMITTED, 5.0)
    assert sm.master(1).first == {} and sm.master(1).last == {}


# ------------------------------------------------------------------ ids
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (3, (3,)),
        (0, (0,)),
        ("3", (3,)),
        ("3.1", (3, 1)),
        (" 3.1 ", (3, 1)),
        ("3.1.2", (3, 1, 2)),
        ((3, 1), (3, 1)),
        ([3, 1], (3, 1)),
        ((3,), (3,)),
    ],
)
def test_parse_fqid(value: object, expected: tuple[int, ...]) -> None:
    assert parse_fqid(value) == expected  # type: ignore[arg-type]
    assert parse_fqid(fqid_str(expected)) == expected


@pytest.mark.parametrize(
    "value",
    [-1, "", "3.", ".1", "3..1", "a", "3.x", "-3", "3.-1", (), [], (3, "1"), [3.0], (True,), True, None, 3.5, {3}],
)
def test_parse_fqid_rejects(value: object) -> None:
    with pytest.raises(ValueError, match="not a job id"):
        parse_fqid(value)  # type: ignore[arg-type]


def test_fqid_str() -> None:
    assert fqid_str((3,)) == "3"
    assert fqid_str((3, 1)) == "3.1"
    assert fqid_str((12, 0, 4)) == "12.0.4"
