"""Fair share among owners: runs waiting for a backend's slots are taken round-robin by owner.

A backend with a bounded number of slots (``local``'s ``max_running``, an ssh
host's ``slots``) keeps its waiting runs in a :class:`FairQueue` rather than
one first-come-first-served queue: one queue per owner, served in turn, so
that a user who queued thousands of runs does not starve another's one run
(the role of HTCondor's per-owner queues and Slurm's fair-share factor).
Within one owner's queue the order is first come, first served.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    """Items of several owners; :meth:`popleft` takes the next owner's oldest, owners in turn.

    ``owner_of`` names an item's owner (any hashable; ``None`` is the orchestrator's own user, an owner like any
    other). An owner whose queue runs empty leaves the turn and joins it again at the end when it adds an item.
    """

    def __init__(self, owner_of: Callable[[T], Hashable]) -> None:
        self._owner_of = owner_of
        self._queues: dict[Hashable, deque[T]] = {}
        #: Owners with waiting items, in the order they are served next.
        self._turn: deque[Hashable] = deque()
        self._len = 0

    def append(self, item: T) -> None:
        owner = self._owner_of(item)
        queue = self._queues.get(owner)
        if queue is None:
            queue = self._queues[owner] = deque()
            self._turn.append(owner)
        queue.append(item)
        self._len += 1

    def popleft(self) -> T:
        """The oldest item of the owner whose turn it is; that owner goes to the end of the turn."""
        if not self._turn:
            raise IndexError("pop from an empty FairQueue")
        owner = self._turn.popleft()
        queue = self._queues[owner]
        item = queue.popleft()
        if queue:
            self._turn.append(owner)
        else:
            del self._queues[owner]
        self._len -= 1
        return item

    def peek(self) -> T:
        """The item :meth:`popleft` would take, left in place (a taker that may not take it yet looks first)."""
        if not self._turn:
            raise IndexError("peek at an empty FairQueue")
        return self._queues[self._turn[0]][0]

    def waiting(self) -> dict[Hashable, int]:
        """Items waiting, per owner."""
        return {owner: len(queue) for owner, queue in self._queues.items()}

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[T]:
        """Every waiting item (owner by owner, not in the order they would be taken)."""
        for queue in self._queues.values():
            yield from queue


__all__ = ["FairQueue"]
