"""``StateMachine.validate_state()`` (core.validate): a state the repository could hand back corrupted is caught,
naming the job and what disagrees; every state the handlers make passes (the harness validates after each
event of every rule test, the property test after each step of its sequences)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.events import SubmitRequested
from orchestrator.core.instructions import SendSubmit
from orchestrator.core.statuses import JobStatus
from orchestrator.core.table import RunExtra, RunTable
from orchestrator.core.validate import InvalidState

from .harness import Harness, only, profile


def table(*statuses: JobStatus, attempt: int = 1, extras: dict[int, RunExtra] | None = None,
          n_attempts: int | None = None) -> RunTable:
    n = len(statuses) if n_attempts is None else n_attempts
    return RunTable.restore(bytearray(s.code for s in statuses), [attempt] * n, {}, extras or {})


def test_states_the_handlers_make_are_valid() -> None:
    h = Harness()
    job = h.add(profile())
    h.submit_all(job, 3)
    h.report(job, [0], JobStatus.RUNNING)
    h.report(job, [1], JobStatus.HELD)
    h.report(job, [2], JobStatus.COMPLETED)
    single = h.add(profile(splits=False))
    step = h.request(SubmitRequested, single)
    step = h.prepared(step, single, 0)
    h.outcomes(only(step, SendSubmit))
    h.sm.load(9, profile(), created=1.0, table=table(JobStatus.COMPLETED, JobStatus.FAILED), master=True,
              partition={"phase": "subjobs", "prejob": 10})
    h.sm.load(10, profile(splits=False), created=1.0, table=table(JobStatus.COMPLETED), link=(9, "prejob"))
    h.sm.validate_state()


CORRUPTED: list[tuple[str, dict[str, Any], str]] = [
    ("a running run never submitted", {"table": table(JobStatus.RUNNING, attempt=0)},
     "job 4: run 0 is running with attempt 0"),
    ("a held subjob never submitted", {"table": table(JobStatus.FAILED, JobStatus.HELD, attempt=0), "master": True},
     "job 4: run 1 is held with attempt 0"),
    ("arrays of different lengths", {"table": table(JobStatus.NEW, JobStatus.NEW, n_attempts=1), "master": True},
     "job 4: 1 attempt counters for 2 runs"),
    ("extras of a run it does not have", {"table": table(JobStatus.NEW, extras={3: RunExtra(reason="r")})},
     "job 4: extras for runs [3]"),
    ("two runs and no master flag", {"table": table(JobStatus.NEW, JobStatus.NEW)}, "job 4: runs itself but has 2"),
    ("a negative submit counter", {"attempt": -1}, "job 4: its own submit counter is -1"),
    ("an unknown phase", {"partition": {"phase": "merging"}}, "job 4: has an unknown phase 'merging'"),
    ("an unknown link role", {"link": (3, "helper")}, "job 4: is linked as 'helper'"),
    ("a link its master does not name", {"link": (3, "aggregator")}, "job 4: is 3's aggregator, but 3 names 7"),
]


@pytest.mark.parametrize(("stored", "expected"), [c[1:] for c in CORRUPTED], ids=[c[0] for c in CORRUPTED])
def test_a_corrupted_stored_job_is_named_with_what_disagrees(stored: dict[str, Any], expected: str) -> None:
    h = Harness()
    h.sm.load(3, profile(), created=1.0, table=table(JobStatus.COMPLETED), master=True,
              partition={"phase": "aggregator-ended", "aggregator": 7})
    h.sm.validate_state()
    h.sm.load(4, profile(), created=1.0, **stored)
    with pytest.raises(InvalidState, match=expected.replace("[", r"\[").replace("]", r"\]")):
        h.sm.validate_state()
    h.sm.forget(4)
    h.sm.validate_state()  # the rest of the state was never in question


def test_a_master_naming_a_linked_job_linked_elsewhere_is_caught() -> None:
    h = Harness()
    h.sm.load(1, profile(), created=1.0, table=table(JobStatus.COMPLETED), master=True, partition={"prejob": 2})
    h.sm.load(2, profile(splits=False), created=1.0, table=table(JobStatus.COMPLETED), link=(5, "prejob"))
    with pytest.raises(InvalidState, match=r"job 1: names 2 as its prejob, but 2 is linked as \(5, 'prejob'\)"):
        h.sm.validate_state()


def test_invalid_state_is_an_assertion_error() -> None:
    """Whoever runs with assertions in mind (pytest, a debug run) treats it as one."""
    assert issubclass(InvalidState, AssertionError)
