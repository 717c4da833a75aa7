"""The fair-share queue (``orchestrator.plugin.fairshare``): owners served in turn, each owner's items in order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.plugin.fairshare import FairQueue


def owner(item: tuple[str, int]) -> str:
    return item[0]


def test_one_owners_thousands_do_not_starve_anothers_one() -> None:
    queue: FairQueue[tuple[str, int]] = FairQueue(owner)
    for i in range(1000):
        queue.append(("bin", i))
    queue.append(("nobody", 0))
    taken = [queue.popleft(), queue.popleft()]
    assert ("nobody", 0) in taken and len(queue) == 999
    assert queue.waiting() == {"bin": 999}
    with pytest.raises(IndexError):
        FairQueue(owner).popleft()


@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", None]), st.integers())))
def test_round_robin_by_owner_and_first_come_first_served_within_one(items: list[tuple[str, int]]) -> None:
    queue: FairQueue[tuple[str, int]] = FairQueue(owner)
    for item in items:
        queue.append(item)
    assert len(queue) == len(items) and sorted(queue, key=repr) == sorted(items, key=repr)
    taken = [queue.popleft() for _ in range(len(items))]
    assert not queue and sorted(taken, key=repr) == sorted(items, key=repr)
    for who in {o for o, _ in items}:  # each owner's items in the order they came
        assert [t for t in taken if t[0] == who] == [t for t in items if t[0] == who]
    # Nobody waits for more than one turn of the others: between two of an owner's items, each other owner that
    # still had items waiting got at most one.
    for k in range(1, len(taken)):
        if taken[k][0] == taken[k - 1][0]:  # two in a row: no other owner had any left
            assert all(t[0] == taken[k][0] for t in taken[k:])
