"""A story per job (issue 25): ``orch.story(fqid)`` and ``orchestrator story ID`` tell, in order and by stimulus id,
every event, change and instruction that touched a job, embedded and through a service.

The subjob told is submitted, lost (the ``sim`` backend stops answering through its documented ``faults.json``,
the monitor reports the silence, and the core counts the run lost once ``lost_after_seconds`` passed), retried and
killed: each of those steps is in its story, in that order, with the stimulus id that ties a request (or the
silence report the core decided on) to its instructions, outcomes and changes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from transports import opened

from orchestrator import ArgSplitter, Backend, Executable, Job, JobError, Orchestrator, RetryPolicy

pytestmark = pytest.mark.anyio

EXE = str(Path(sys.executable).with_name("orchestrator"))
#: Quick polls, and a backend silent for half a second counts its runs lost; in the home's file, for a service too.
SETTINGS = "[core]\npoll_interval = 0.05\nlost_after_seconds = 0.5\n"


@pytest.fixture(params=["embedded", "service"])
def home(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "home"
    path.mkdir()
    (path / "orchestrator.toml").write_text(SETTINGS)
    yield from opened(path, served=request.param == "service")


@pytest.fixture
def served_home(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "home"
    path.mkdir()
    (path / "orchestrator.toml").write_text(SETTINGS)
    yield from opened(path, served=True)


def sim_faults(home: Path, **faults: str) -> None:
    """Switch the sim backend's faults (its documented ``faults.json``); none given switches them off."""
    path = home / "backends" / "sim" / "faults.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(faults))


async def until(done: Callable[[], bool], timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while not done():
            await anyio.sleep(0.05)


async def submitted_lost_retried_killed(orch: Orchestrator, home: Path) -> Job:
    """A master of two long sim runs; its subjob 1 submitted, lost with its backend, retried, then killed."""
    master = await orch.jobs.add(Job(name="told", application=Executable("/bin/true"),
                                     splitter=ArgSplitter([["a"], ["b"]]),
                                     backend=Backend("sim", run_seconds=60, polled=True),
                                     retry=RetryPolicy(max_late_unhandled=1)))
    await master.submit()
    sub = master.subjobs[1]
    await until(lambda: sub.status in ("submitted", "running"))
    sim_faults(home, status="raise")  # the backend stops answering: its runs are lost after 0.5 s, and retried
    await until(lambda: sub.info.submit_counter >= 2)
    sim_faults(home)
    with anyio.fail_after(30):  # the retry accepted (a mirrored status may still be the one before the loss)
        while not any(e["type"] == "SubmitOutcomes" and e["stimulus_id"].startswith("silent-")
                      for e in await orch.story(sub)):
            await anyio.sleep(0.05)
    await sub.kill()
    await until(lambda: sub.status == "killed")
    return master


#: The milestones of subjob 1's story, in order: (kind, type, words of the description, which stimulus).
MILESTONES = [
    ("event", "SubmitRequested", "submit requested", "submit"),
    ("event", "Prepared", "prepared: 2 subjobs", "submit"),
    ("change", "StatusChanged", "new -> submitting", "submit"),
    ("instruction", "SendSubmit", "submit attempt 1 to sim", "submit"),
    ("event", "SubmitOutcomes", "submission accepted", "submit"),
    ("change", "StatusChanged", "submitting -> submitted", "submit"),
    ("event", "RunsSilent", "so lost: no answer from backend sim", "silent"),
    ("change", "StatusChanged", "-> failed", "silent"),
    ("change", "StatusChanged", "-> submitting", "silent"),
    ("instruction", "SendKill", "kill attempt 1 at sim", "silent"),
    ("instruction", "SendSubmit", "submit attempt 2 to sim", "silent"),
    ("event", "SubmitOutcomes", "submission accepted", "silent"),
    ("change", "StatusChanged", "submitting -> submitted", "silent"),
    ("event", "KillRequested", "kill requested", "kill"),
    ("instruction", "SendKill", "kill attempt 2 at sim", "kill"),
    ("event", "KillOutcomes", "kill done", "kill"),
    ("change", "StatusChanged", "-> killed", "kill"),  # (submitted, or running if a poll said so first)
]


def check_story(story: list[dict[str, Any]]) -> None:
    """Every milestone, in order, each with its stimulus id: the request's for what it caused, the silence report's
    for the loss the core decided on and the retry it caused."""
    assert story and all(set(e) == {"stimulus_id", "time", "kind", "type", "description"} for e in story), story
    assert all(e["stimulus_id"] and isinstance(e["time"], float) for e in story)
    at = 0
    sids: dict[str, str] = {}
    for kind, name, words, stimulus in MILESTONES:
        while at < len(story) and not (story[at]["kind"] == kind and story[at]["type"] == name
                                       and words in story[at]["description"]):
            at += 1
        assert at < len(story), f"no {kind} {name} '{words}' after the ones before in:\n" + "\n".join(map(str, story))
        sid = story[at]["stimulus_id"]
        assert sid.startswith(f"{stimulus}-"), (kind, name, sid)
        assert sids.setdefault(stimulus, sid) == sid, f"{kind} {name}: stimulus {sid}, not {sids[stimulus]}"
        at += 1
    # A step's entries share its stimulus id and stay together: the three stimuli come one after the other.
    order = [e["stimulus_id"] for e in story if e["stimulus_id"] in sids.values()]
    assert order == sorted(order, key=[sids["submit"], sids["silent"], sids["kill"]].index)


async def test_a_subjob_submitted_lost_retried_and_killed_is_told_in_order(home: Path) -> None:
    async with Orchestrator(home=home) as orch:
        master = await submitted_lost_retried_killed(orch, home)
        try:
            sub = master.subjobs[1]
            story = await orch.story(sub.fqid)
            check_story(story)
            # The other ways to name it tell the same story; the other subjob, silent with it, was lost by the core
            # from the same report (one report per job and start of silence), and its story says so.
            assert await orch.story((*master.fqid_tuple, 1)) == story == await sub.story()
            other = await orch.story(master.subjobs[0])
            lost = {e["stimulus_id"] for e in other if e["type"] == "RunsSilent"}
            assert lost and lost == {e["stimulus_id"] for e in story if e["type"] == "RunsSilent"}
            # The master's own: the request naming it, its preparation and its status; not its subjobs' batches.
            own = await orch.story(master.fqid)
            kinds = [(e["kind"], e["type"]) for e in own]
            assert ("event", "SubmitRequested") in kinds and ("instruction", "Prepare") in kinds
            assert any(e["kind"] == "change" and e["description"] == "new -> submitting" for e in own)
            assert ("instruction", "SendSubmit") not in kinds, "\n".join(map(str, own))
            # A subjob's loss is told on the master only as the cause of the master's own change.
            assert all(e["description"].startswith("about ") for e in own if e["type"] == "RunsSilent"), own
            with pytest.raises(JobError, match="99"):
                await orch.story("99")
        finally:
            await master.kill()
            await master.wait(timeout=30)


def cli(home: Path, *args: str) -> str:
    done = subprocess.run([EXE, "--home", str(home), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done.stdout


#: A line of ``orchestrator story``: time (to the millisecond), stimulus id, kind, type, description.
LINE = re.compile(r"^(\d\d:\d\d:\d\d\.\d{3}|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})  +(\S+)  +(event|change|refusal|"
                  r"instruction)  +(\w+)(?:  +(.*))?$")


async def test_orchestrator_story_prints_the_subjob_s_story_one_line_each(served_home: Path) -> None:
    async with Orchestrator(home=served_home) as orch:
        master = await submitted_lost_retried_killed(orch, served_home)
        fqid = master.subjobs[1].fqid
        told = await orch.story(fqid)
    try:
        out = cli(served_home, "story", fqid)
        parsed = [LINE.match(line) for line in out.splitlines()]
        assert all(parsed), out
        rows = [m.groups() for m in parsed if m is not None]
        assert [(sid, kind, name, words or "") for _, sid, kind, name, words in rows] == [
            (e["stimulus_id"], e["kind"], e["type"], e["description"]) for e in told]
        check_story([{"stimulus_id": sid, "time": 0.0, "kind": kind, "type": name, "description": words or ""}
                     for _, sid, kind, name, words in rows])
        document = json.loads(cli(served_home, "story", fqid, "--json"))
        assert document["schema"] == 1 and document["fqid"] == fqid and document["story"] == told
    finally:
        async with Orchestrator(home=served_home) as orch:
            await orch.jobs[master.id].kill()
            await orch.jobs[master.id].wait(timeout=30)
