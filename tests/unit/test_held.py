"""The runs a driver holds, kept compactly (``runtime/held.py``): what goes in comes out, as handles made on demand."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.core.statuses import JobStatus
from orchestrator.plugin.contract import RunHandle
from orchestrator.runtime.held import HeldRuns, PackedStrings, RunKey

S = JobStatus


def make(key: RunKey, backend_id: str, settings: Mapping[str, Any], status: JobStatus, attempt: int) -> RunHandle:
    fqid = f"{key[0]}" if key[1] is None else f"{key[0]}.{key[1]}"
    return RunHandle(fqid, key[1] or 0, backend_id, settings, Path("/w", fqid, "output"), status, f"k-{fqid}-{attempt}",
                     attempt, Path("/w", fqid))


def test_packed_strings_keep_each_value_until_set_again_or_cleared() -> None:
    packed = PackedStrings()
    packed.grow(5)
    assert [packed.get(i) for i in range(5)] == [None] * 5
    packed.set(3, "sim:3.3:1:é")  # not only ASCII
    packed.set(0, "")
    packed.set(3, "again")
    assert (packed.get(0), packed.get(3), packed.get(4)) == ("", "again", None)
    packed.clear(0)
    assert packed.get(0) is None and len(packed) == 5


def test_packed_strings_compact_what_was_overwritten() -> None:
    packed = PackedStrings()
    packed.grow(2)
    for n in range(40_000):  # 40,000 rewrites of 60 bytes: over a megabyte of dead bytes, compacted away
        packed.set(n % 2, f"{n:060d}")
    assert packed.get(0) == f"{39_998:060d}" and packed.get(1) == f"{39_999:060d}"
    assert packed.nbytes < 1 << 21


def test_packed_strings_set_a_slice_at_once() -> None:
    packed = PackedStrings()
    packed.grow(6)
    packed.set(2, "old")
    packed.set_slice(1, ["b", "", "dé"])
    assert [packed.get(i) for i in range(6)] == [None, "b", "", "dé", None, None]
    for _ in range(20_000):  # rewriting slices leaves dead bytes behind: compacted away
        packed.set_slice(0, [f"{n:030d}" for n in range(6)])
    assert packed.get(5) == f"{5:030d}" and packed.nbytes < 1 << 21


def test_held_runs_of_a_master_and_of_a_job_that_runs_itself() -> None:
    held = HeldRuns(make)
    common = {"run_seconds": 1}
    own = {"run_seconds": 9}
    held.add_many(3, [0, 1, 2, 7], ["a", "b", "c", "d"], [1, 1, 2, 1], [common, dict(common), own, common])
    held.add((5, None), "top", 4, common, S.RUNNING)
    assert len(held) == 5 and (3, 7) in held and (3, 4) not in held and (5, None) in held and (5, 0) not in held
    handle = held.handle((3, 2))
    assert handle is not None
    assert (handle.fqid, handle.index, handle.backend_id, handle.settings, handle.status, handle.attempt) == (
        "3.2", 2, "c", own, S.SUBMITTED, 2)
    assert held.settings((3, 1)) == common and held.status((5, None)) == S.RUNNING
    assert sorted(held.keys(3)) == [(3, 0), (3, 1), (3, 2), (3, 7)] and list(held.keys(5)) == [(5, None)]
    held.set_statuses(3, [0, 1, 4], S.RUNNING)  # 4 is not held: passed over
    assert held.status((3, 1)) == S.RUNNING and (3, 4) not in held
    assert held.keys_in(3, {S.RUNNING, S.COMPLETING}) == [(3, 0), (3, 1)] and held.keys_in(3, {S.HELD}) == []
    assert held.keys_in(5, {S.RUNNING}) == [(5, None)] and held.keys_in(5, {S.SUBMITTED}) == []
    assert held.keys_in(9, {S.RUNNING}) == []
    popped = held.pop((3, 0))
    assert popped is not None and popped.backend_id == "a" and held.pop((3, 0)) is None
    held.discard_many(3, [1, 2, 7])
    assert list(held.keys(3)) == [] and 3 not in held.jobs() and len(held) == 1
    assert held.discard((5, None)) and not held.discard((5, None)) and len(held) == 0


def test_held_runs_resubmitted_take_their_new_id_and_attempt() -> None:
    held = HeldRuns(make)
    held.add_many(1, list(range(1000)), [f"id-{i}" for i in range(1000)], [1] * 1000, [{}] * 1000)
    held.add_many(1, [1003, 1001], ["x", "y"], [1, 1], [{}, {}])  # out of order, past the end: grown
    assert held.handle((1, 1003)) is not None and held.status((1, 1002)) is None
    held.discard_many(1, [1001, 1003])
    held.discard_many(1, range(0, 1000, 2))
    held.add((1, 10), "id-10-again", 2, {})
    assert len(held) == 501 and len(list(held.keys(1))) == 501
    handle = held.handle((1, 10))
    assert handle is not None and (handle.backend_id, handle.attempt, handle.key) == ("id-10-again", 2, "k-1.10-2")
