"""docs/events.md describes every event type the service streams, with every field it carries."""

from __future__ import annotations

import dataclasses
import re

import pytest
from docblocks import ROOT

from orchestrator.core import codec

TEXT = (ROOT / "docs" / "events.md").read_text()
ROWS = {m.group(1): m.group(0) for m in re.finditer(r"^\| `(\w+)` \|.*$", TEXT, re.M)}
COMMON = {"stimulus_id", "time"}
#: Base classes: never streamed themselves.
BASES = {"Request"}


@pytest.mark.parametrize("name", sorted(set(codec.TYPES) - BASES))
def test_each_event_type_has_a_row_naming_its_fields(name: str) -> None:
    assert name in ROWS, f"docs/events.md has no row for {name}"
    fields = {f.name for f in dataclasses.fields(codec.TYPES[name])} - COMMON
    missing = sorted(f for f in fields if f"`{f}`" not in ROWS[name])
    assert not missing, f"docs/events.md: {name}'s row does not name {missing}"


def test_the_profile_fields_are_listed() -> None:
    from orchestrator.core.events import Profile

    paragraph = TEXT[TEXT.index("A `profile` is"):]
    missing = [f.name for f in dataclasses.fields(Profile) if f"`{f.name}`" not in paragraph]
    assert not missing, f"docs/events.md: the profile's fields {missing} are not listed"


def test_no_row_names_a_type_that_does_not_exist() -> None:
    table = TEXT[TEXT.index("## The types"):TEXT.index("A `profile` is")]
    rows = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert rows and set(rows) <= set(codec.TYPES), sorted(set(rows) - set(codec.TYPES))

