"""A declared ``outputfiles`` pattern that matched nothing fails its run (Ganga's ``FailJobIfNoOutputMatched``).

The wrapper writes ``NOMATCH <pattern>`` in the run's log; the analyser fails
a run that would have succeeded at application level, naming the pattern.
``Job(fail_on_missing_output=False)`` or the setting ``[core]
fail_on_missing_output = false`` turns it off. Embedded and through a
service; the ``ssh`` backend's remote wrapper is checked in ``test_ssh.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from transports import opened

from orchestrator import ArgSplitter, Backend, ConfigError, Executable, Job, Orchestrator, RetryPolicy

pytestmark = pytest.mark.anyio

#: Subjob 0 leaves a.root and b.txt; subjob 1 leaves b.txt only; subjob 2 nothing.
SCRIPT = 'if [ "$1" = 0 ]; then echo a > a.root; fi; if [ "$1" != 2 ]; then echo b > b.txt; fi'


def job(**kw: object) -> Job:
    return Job(name="outputs", application=Executable("/bin/sh", args=["-c", SCRIPT, "sh", "0"]),
               splitter=ArgSplitter([["-c", SCRIPT, "sh", str(i)] for i in range(3)]), backend="local",
               outputfiles=["*.root", "b.txt"], retry=RetryPolicy(max_early=0, max_late_unhandled=0), **kw)


async def test_a_pattern_that_matched_nothing_fails_the_run_naming_it(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(job())
        await j.submit()
        await j.wait(timeout=30)
        ok, one, none = j.subjobs
        assert ok.status == "completed" and ok.info.reason is None
        assert (ok.outputdir / "a.root").read_text() == "a\n" and (ok.outputdir / "b.txt").exists()
        assert one.status == none.status == j.status == "failed"
        assert (one.info.reason or "").startswith("output file pattern '*.root' matched nothing"), one.info.reason
        assert (none.info.reason or "").startswith("output file patterns '*.root', 'b.txt' matched nothing")
        [entry] = one.info.history
        assert (entry["level"], entry["verdict"], entry["action"]) == ("application", "early", "failed")
        assert "NOMATCH *.root" in (one.outputdir / "orch.log").read_text()
        assert (one.outputdir / "b.txt").exists()  # what did match is kept all the same

        # The simulated backend writes no files: it never checks (documented).
        sim = await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("sim", run_seconds=0),
                                      outputfiles=["*.root"]))
        await sim.submit()
        await sim.wait(timeout=20)
        assert sim.status == "completed"


async def test_fail_on_missing_output_false_lets_the_run_complete(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(job(fail_on_missing_output=False))
        await j.submit()
        await j.wait(timeout=30)
        assert [s.status.value for s in j.subjobs] == ["completed"] * 3 and j.status == "completed"
        assert "NOMATCH b.txt" in (j.subjobs[2].outputdir / "orch.log").read_text()  # said, not judged
    async with Orchestrator(home=api_home) as orch:
        assert orch.jobs[j.id].fail_on_missing_output is False  # stored with the job


@pytest.fixture(params=["embedded", "service"])
def lenient_home(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A home whose settings turn the check off, opened in the test's process or held by a service."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text("[core]\nfail_on_missing_output = false\n")
    yield from opened(home, served=request.param == "service")


async def test_the_home_setting_turns_it_off_and_a_job_turns_it_back_on(lenient_home: Path) -> None:
    async with Orchestrator(home=lenient_home) as orch:
        lenient = await orch.jobs.add(job())
        strict = await orch.jobs.add(job(fail_on_missing_output=True))
        await orch.jobs[:].submit()
        await orch.jobs[:].wait(timeout=30)
        assert lenient.status == "completed"
        assert [s.status.value for s in strict.subjobs] == ["completed", "failed", "failed"]
        assert "'*.root' matched nothing" in strict.subjobs[1].info.reason


async def test_a_malformed_setting_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "orchestrator.toml").write_text('[core]\nfail_on_missing_output = "no"\n')
    with pytest.raises(ConfigError, match="core.fail_on_missing_output must be true or false"):
        async with Orchestrator(home=tmp_path):
            pass
