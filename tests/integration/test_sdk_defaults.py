"""The SDK's default forms (docs/plugins.md): a driver written with only the bulk forms works run by run, the
single-run forms derived from them; one with neither form is refused when loaded, clearly, and a call of a
default form on it says what is missing instead of recursing.

Both drivers are test backends (``bulkonly``, ``hollow``), registered by entry points like any plugin.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from orchestrator import ArgSplitter, Backend, Executable, Job, JobError, Orchestrator
from orchestrator.core.stored import MAX_TEXT
from orchestrator.plugin import DriverContext, JobStatus, RunHandle, RunSpec

pytestmark = pytest.mark.anyio


async def test_a_driver_of_bulk_forms_only_is_called_run_by_run(tmp_path: Path, test_drivers: None) -> None:
    job = Job(application=Executable("/bin/true"), splitter=ArgSplitter([["a"], ["b"], ["hang"]]),
              backend=Backend("bulkonly"))
    async with Orchestrator(home=tmp_path, config={"core": {"poll_interval": 0.05}}) as orch:
        j = await orch.jobs.add(job)
        await j.submit(keep_going=True)
        await orch.refresh()
        assert [s.status.value for s in j.subjobs] == ["completed", "completed", "running"]
        await j.kill()
        await j.wait(timeout=10)
        assert [s.status.value for s in j.subjobs] == ["completed", "completed", "killed"]
        sizes = (await orch.metrics())["backends"]["bulkonly"]["driver"]["sizes"]
    # The runtime called submit(), kill() and status() (no bulk capability declared); the SDK's forms of
    # them called the bulk ones, one run each.
    assert sizes["submit_bulk"] == [1, 1, 1] and sizes["kill_bulk"] == [1]
    assert sizes["status_bulk"] and set(sizes["status_bulk"]) == {1}


@pytest.mark.parametrize(("arg", "ended", "why", "fault"), [
    ("mangle", "new", "the backend answered an unusable backend id: a character UTF-8 cannot encode", "submit"),
    ("garble", "failed", "unintelligible answers from backend bulkonly", "status")])
async def test_a_driver_answer_the_repository_cannot_hold_leaves_the_home_written_on(
        tmp_path: Path, test_drivers: None, arg: str, ended: str, why: str, fault: str) -> None:
    """A driver's answer is stored as it is. A backend id with a lone surrogate (``mangle``), a report whose reason
    is ``bytes`` and whose exit code no 64-bit integer holds (``garble``): the repository refused them at every
    flush, and nothing of the home was written again (a reopened home had lost all since). The first now refuses
    its run, saying why; the second is an unintelligible answer, its run lost once silent for
    ``lost_after_seconds``. The other runs, and every later job, are written."""
    config = {"core": {"poll_interval": 0.05, "lost_after_seconds": 0.5}}
    async with Orchestrator(home=tmp_path, config=config) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/true"), splitter=ArgSplitter([["a"], [arg]]),
                                    backend=Backend("bulkonly")))
        await j.submit(keep_going=True)
        await j.wait(timeout=20)
        assert [s.status.value for s in j.subjobs] == ["completed", ended]
        assert why in str(j.subjobs[1].info.reason)
        later = await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("bulkonly")))
        await later.submit()
        await later.wait(timeout=10)
        faults = (await orch.metrics())["backends"]["bulkonly"]["faults"]
    assert faults.get(fault, 0) >= 1
    async with Orchestrator(home=tmp_path, config=config) as orch:
        assert [s.status.value for s in orch.jobs[0].subjobs] == ["completed", ended]
        assert orch.jobs[1].status.value == "completed"


@pytest.mark.parametrize(("arg", "ended", "word"), [("babble", "failed", "babble "),
                                                     ("chatter", "new", "chatter ")])
async def test_a_drivers_reason_of_a_mebibyte_is_kept_to_16_kib(tmp_path: Path, test_drivers: None, arg: str,
                                                                ended: str, word: str) -> None:
    """A driver's reason for a run (``babble``: its report; ``chatter``: its submission's error) is stored thrice
    in the run's record, as a keyword's data from a run's log is: kept to the same 16 KiB."""
    async with Orchestrator(home=tmp_path) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/true"), splitter=ArgSplitter([["a"], [arg]]),
                                    backend=Backend("bulkonly")))
        await j.submit(keep_going=True)
        await j.wait(timeout=20)
        reason = str(j.subjobs[1].info.reason)
        assert [s.status.value for s in j.subjobs] == ["completed", ended]
    assert word * 100 in reason and MAX_TEXT <= len(reason) < MAX_TEXT + 100, len(reason)
    async with Orchestrator(home=tmp_path) as orch:
        assert orch.jobs[0].subjobs[1].info.reason == reason


async def test_a_driver_of_neither_form_is_refused_at_load(tmp_path: Path, test_drivers: None) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        with pytest.raises(JobError, match=r"backend 'hollow': driver HollowDriver must implement submit\(\) "
                                           r"or submit_bulk\(\)"):
            await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("hollow")))
        assert len(orch.jobs) == 0


async def test_a_default_form_with_nothing_under_it_says_so(tmp_path: Path, test_drivers: None) -> None:
    from orch_testdrivers import HollowDriver  # on the path while the test backends are installed

    driver = HollowDriver(DriverContext(home=tmp_path))
    run = RunSpec(fqid="1", index=0, attempt=1, key="k", executable="/bin/true", args=(), env={}, settings={},
                  inputs=(), outputfiles=(), jobdir=tmp_path, inputdir=tmp_path, outputdir=tmp_path,
                  workdir=tmp_path)
    handle = RunHandle("1", 0, "b", {}, tmp_path, JobStatus.RUNNING)
    calls: list[tuple[Callable[[], Awaitable[object]], str]] = [
        (lambda: driver.submit(run), "submit"), (lambda: driver.submit_bulk([run]), "submit"),
        (lambda: driver.kill(handle), "kill"), (lambda: driver.kill_bulk([handle]), "kill")]
    for call, form in calls:
        with pytest.raises(NotImplementedError, match=f"must implement {form}\\(\\) or {form}_bulk\\(\\)"):
            await call()
