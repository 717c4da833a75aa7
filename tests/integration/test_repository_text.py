"""What a home stores is text its repository can keep. PostgreSQL keeps no NUL in ``text``, and neither
repository takes a lone surrogate; a value the repository refused was put back in the writer's queue at every
flush, so nothing of the home was written again: one run's state stopped a team's service from recording anything.
A state's NUL is now written escaped, and a state file holding a raw one is no state (skipped, as any malformed
one): the home is written on."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from orchestrator import ArgSplitter, Executable, Job, JobError, Orchestrator
from orchestrator.checkpoint import State
from orchestrator.core.runlog import MAX_KEYWORD_DATA, parse_log

pytestmark = pytest.mark.anyio

FORGER = r"""mkdir -p .orch-state
printf 'orch-state\t1\nvar\tx\ta\000b\n' > .orch-state/1.state
echo 1 > .orch-state/current
"""


async def test_a_state_with_a_raw_nul_leaves_a_postgresql_home_written(tmp_path: Path, pg_url: str) -> None:
    config = {"repository": {"url": pg_url}}
    async with Orchestrator(home=tmp_path / "home", config=config) as orch:
        forged = await orch.jobs.add(Job(name="forged", application=Executable("/bin/sh", args=["-c", FORGER]),
                                         backend="local"))
        await forged.submit()
        await forged.wait(timeout=30)
        later = await orch.jobs.add(Job(name="later", application=Executable("/bin/true"), backend="local"))
        await later.submit()
        await later.wait(timeout=30)
        assert (forged.status.value, later.status.value) == ("completed", "completed")
    async with Orchestrator(home=tmp_path / "home", config=config) as orch:
        assert [(j.name, j.status.value) for j in orch.jobs] == [("forged", "completed"), ("later", "completed")]


async def test_a_states_nul_is_written_escaped_and_a_raw_one_is_refused(tmp_path: Path) -> None:
    state = State.from_text("orch-state\t1\n", fqid="7")
    state.values["x"] = "a\0b\\0"
    text = state.dump("7:1", 1, 1.0)
    assert "\0" not in text and State.from_text(text).values["x"] == "a\0b\\0"
    for bad, why in (("orch-state\t1\nvar\tx\ta\0b\n", "a NUL character"),
                     ("orch-state\t1\nvar\tx\ta\udcffb\n", "a character UTF-8 cannot encode")):
        with pytest.raises(Exception, match=why):
            State.from_text(bad)
    async with Orchestrator(home=tmp_path / "home") as orch:
        j = await orch.jobs.add(Job(name="s", application=Executable("/bin/true"), backend="local"))
        await j.submit()
        await j.wait(timeout=30)
        with pytest.raises(JobError, match=r"not a state: .*a NUL character") as refused:
            await j.resubmit(from_state="orch-state\t1\nvar\tx\ta\0b\n")
        assert refused.value.field == "from_state"


@pytest.mark.parametrize(("name", "why"), [("a\0b", "it holds a NUL character"),
                                           ("a\udcffb", "it holds a character UTF-8 cannot encode")])
async def test_a_job_name_no_repository_keeps_is_refused_naming_the_field(tmp_path: Path, name: str,
                                                                           why: str) -> None:
    async with Orchestrator(home=tmp_path / "home") as orch:
        with pytest.raises(JobError, match=f"name must be text: {why}") as refused:
            await orch.jobs.add(Job(name=name, application=Executable("/bin/true"), backend="local"))
        assert refused.value.field == "name" and len(orch.jobs) == 0
        fine = await orch.jobs.add(Job(name="é", application=Executable("/bin/true"), backend="local"))
        await fine.submit()
        await fine.wait(timeout=30)
    async with Orchestrator(home=tmp_path / "home") as orch:
        assert [(j.name, j.status.value) for j in orch.jobs] == [("é", "completed")]


@pytest.mark.parametrize(("extra", "field"), [({"metadata": {"x": float("nan")}}, "metadata"),
                                              ({"splitter": ArgSplitter([[float("-inf")]])}, "splitter")])
async def test_a_definition_holding_nan_or_infinity_is_refused_naming_the_field(
        tmp_path: Path, extra: dict[str, Any], field: str) -> None:
    """``json.dumps`` writes NaN and infinity as bare tokens no JSON reader takes: SQLite's JSON functions refused
    the stored definition at every write, then at the home's next open (the home opened no more)."""
    async with Orchestrator(home=tmp_path / "home") as orch:
        job = Job(name="n", application=Executable("/bin/true"), **{"backend": "local", **extra})
        with pytest.raises(JobError, match=r"not finite \(NaN or infinity\)") as refused:
            await orch.jobs.add(job)
        assert refused.value.field == field and len(orch.jobs) == 0
        fine = await orch.jobs.add(Job(name="f", application=Executable("/bin/true"), backend="local",
                                       metadata={"x": 1.5}))
        with pytest.raises(JobError, match=r"not finite") as annotated:
            fine.metadata = {"y": float("nan")}
        assert annotated.value.field == "metadata"
        await fine.submit()
        await fine.wait(timeout=30)
    async with Orchestrator(home=tmp_path / "home") as orch:
        assert [(j.name, j.status.value, j.metadata) for j in orch.jobs] == [("f", "completed", {"x": 1.5})]


def test_a_keywords_data_is_kept_to_16_kib() -> None:
    log = parse_log(f"1.0 START 5 h\n2.0 FAILED {'x' * (1 << 20)}\n3.0 EXIT 1\n4.0 END 1\n")
    assert [(w, len(d)) for _, w, d in log.keywords] == [("FAILED", MAX_KEYWORD_DATA)] and MAX_KEYWORD_DATA == 16 << 10


async def test_a_home_an_earlier_version_stored_nan_in_opens_leaving_that_job_out(tmp_path: Path) -> None:
    """An earlier version stored a definition holding NaN (bare ``NaN`` in its JSON). SQLite's JSON functions,
    which the open runs over every definition, refused it, and the home no longer opened. It opens now: that job
    is left out, said so in the log, as any definition that cannot be read; the others are served and written."""
    home = tmp_path / "home"
    async with Orchestrator(home=home) as orch:
        for name in ("poisoned", "kept"):
            j = await orch.jobs.add(Job(name=name, application=Executable("/bin/true"), backend="local",
                                        splitter=ArgSplitter([[], []]), metadata={"x": 1.5}))
            await j.submit()
            await j.wait(timeout=30)
    with sqlite3.connect(home / "repository.sqlite") as db:  # as an earlier version left it
        spec = db.execute("SELECT spec FROM jobs WHERE name = 'poisoned'").fetchone()[0]
        assert '"x":1.5' in spec
        db.execute("UPDATE jobs SET spec = ? WHERE name = 'poisoned'", (spec.replace('"x":1.5', '"x":NaN'),))
    with capture_logs() as logs:
        async with Orchestrator(home=home) as orch:
            assert [(j.name, j.status.value) for j in orch.jobs] == [("kept", "completed")]
    said = [e for e in logs if "definition is unreadable" in str(e.get("event"))]
    assert len(said) == 1 and "not JSON compliant" in str(said[0].get("error")), logs
    async with Orchestrator(home=home) as orch:
        later = await orch.jobs.add(Job(name="later", application=Executable("/bin/true"), backend="local"))
        await later.submit()
        await later.wait(timeout=30)
    async with Orchestrator(home=home) as orch:
        assert [(j.name, j.status.value) for j in orch.jobs] == [("kept", "completed"), ("later", "completed")]
