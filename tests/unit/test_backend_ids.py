"""What a driver may answer as a run's backend id (docs/plugins.md, "The backend id is all a later process gets"):
text the repository stores as it is. Anything else refuses the run, saying which rule it broke."""

from __future__ import annotations

import pytest

from orchestrator.plugin import SubmitOutcome
from orchestrator.runtime.bulk import MAX_BACKEND_ID, Faults, checked, unusable_id


@pytest.mark.parametrize("backend_id", ["12345", "12345_7", "https://wms.example:7443/job/Ab-9", "é-ü-ß", "x" * 4096])
def test_an_id_the_repository_can_store_is_taken(backend_id: str) -> None:
    assert unusable_id(backend_id) is None


@pytest.mark.parametrize(("backend_id", "why"), [
    ("", "empty"), ("a\0b", "a NUL character"), ("id-\udcff", "a lone surrogate"), (42, "not text but int"),
    ("x" * (MAX_BACKEND_ID + 1), f"{MAX_BACKEND_ID + 1} characters (at most {MAX_BACKEND_ID})")])
def test_an_id_it_cannot_store_says_why(backend_id: object, why: str) -> None:
    assert why in (unusable_id(backend_id) or "")


def test_a_run_answered_with_such_an_id_is_refused_and_the_fault_counted() -> None:
    faults = Faults()
    refused = checked(SubmitOutcome("3.1", "id-\udcff"), faults)
    assert not refused.ok and refused.backend_id is None
    assert refused.error == ("the backend answered an unusable backend id: "
                             "a character UTF-8 cannot encode in it (a lone surrogate)")
    assert faults.counts == {"submit": 1}
    for fine in (SubmitOutcome("3.2", "77"), SubmitOutcome("3.3", None, "no slots")):
        assert checked(fine, faults) is fine
    assert faults.counts == {"submit": 1}
