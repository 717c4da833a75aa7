"""``local`` starts a run either through its home's launcher or through the wrapper's shell (a run that sets its own
``shell``); the docs promise the same files and words either way (``docs/reference.md``, "local"). Each test here
runs both ways."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest
from test_local import alive

from orchestrator import Backend, Executable, Job, Orchestrator

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["launcher", "wrapper"])
def backend(request: pytest.FixtureRequest) -> Backend:
    """``local`` as most runs take it (the launcher), or with a shell of the run's own (the wrapper)."""
    return Backend("local") if request.param == "launcher" else Backend("local", shell="/bin/sh")


def sh(script: str, backend: Backend) -> Job:
    return Job(application=Executable("/bin/sh", args=["-c", script]), backend=backend)


async def test_no_descriptor_of_the_orchestrator_reaches_a_run(tmp_path: Path, backend: Backend) -> None:
    """A descriptor the orchestrator's process holds open without close-on-exec (one it inherited: a supervisor's
    pipe, say) is not the run's: the program sees its standard three only. (Through the wrapper it got them all.)"""
    leaked = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(leaked, True)
    try:
        async with Orchestrator(home=tmp_path / "home") as orch:
            j = await orch.jobs.add(sh('for f in /proc/$$/fd/*; do echo "${f##*/}"; done', backend))
            await j.submit()
            await j.wait(timeout=30)
            assert j.status == "completed"
            seen = (j.outputdir / "stdout").read_text().split()
    finally:
        os.close(leaked)
    assert str(leaked) not in seen and {"0", "1", "2"} <= set(seen), seen


async def test_a_kill_that_ends_in_sigkill_leaves_no_cpu_record(tmp_path: Path, backend: Backend) -> None:
    """A killed program that ignores SIGTERM is SIGKILLed after ``kill_grace``: "an attempt killed by SIGKILL
    leaves no record" in ``orch.usage``. (The launcher wrote one, with code 143.)"""
    config = {"backends": {"local": {"kill_grace": 0.3}}}
    async with Orchestrator(home=tmp_path / "home", config=config) as orch:
        j = await orch.jobs.add(sh("trap '' TERM; echo started; sleep 30", backend))
        await j.submit()
        with anyio.fail_after(20):
            while not (j.outputdir / "stdout").exists() or "started" not in (j.outputdir / "stdout").read_text():
                await anyio.sleep(0.02)
        group = int((j.outputdir / "orch.1.log").read_text().split()[2])
        await j.kill()
        await j.wait(timeout=30)
        assert j.status == "killed"
        with anyio.fail_after(20):
            while alive(group):  # its end, SIGKILL after kill_grace (reported killed before it came)
                await anyio.sleep(0.02)
        after = await orch.jobs.add(Job(application=Executable("/bin/true"), backend=backend))
        await after.submit()
        await after.wait(timeout=30)  # so the ended program's parent has seen its end: it reaps before it starts
        usage = j.outputdir / "orch.usage"
        assert not usage.exists() or usage.read_text() == "", usage.read_text()


async def test_returned_files_keep_the_spaces_in_their_names_and_their_lines_the_wrappers_clock(
        tmp_path: Path, backend: Backend) -> None:
    """``$ORCH_LOG RETURN_FILE name`` returns the file so named, spaces and all (the wrapper's ``read`` trimmed
    them, and looked for another file); the lines written after the program ends carry the time as every other
    line of the log does, to the hundredth (the launcher's were whole seconds)."""
    script = ("for f in ' lead.txt' 'trail.txt '; do echo x > \"$f\"; $ORCH_LOG RETURN_FILE \"$f\"; done; "
              "$ORCH_LOG RETURN_FILE missing.txt")
    async with Orchestrator(home=tmp_path / "home") as orch:
        j = await orch.jobs.add(sh(script, backend))
        await j.submit()
        await j.wait(timeout=30)
        assert j.status == "completed"
        assert (j.outputdir / " lead.txt").read_text() == (j.outputdir / "trail.txt ").read_text() == "x\n"
        lines = (j.outputdir / "orch.log").read_text().splitlines()
        missing = [line for line in lines if "missing.txt not found" in line]
        assert missing and all("." in line.split()[0] for line in lines), lines


async def test_a_program_ended_by_a_signal_has_the_shells_word_for_it_on_its_stderr(
        tmp_path: Path, backend: Backend) -> None:
    """``sh`` writes "Segmentation fault" on a command's stderr when SIGSEGV ends it, and the failure's reason quotes
    the stderr's last lines; the launcher, which starts programs as ``sh`` would, writes it too. (Its runs' stderr
    stayed empty, and their reason said less.)"""
    async with Orchestrator(home=tmp_path / "home") as orch:
        j = await orch.jobs.add(sh("echo oops >&2; kill -SEGV $$", backend))
        await j.submit()
        await j.wait(timeout=30)
        assert j.status == "failed" and j.info.history[-1]["exit_code"] == 139
        assert (j.outputdir / "stderr").read_text().splitlines() == ["oops", "Segmentation fault"]
        assert (j.info.reason or "").endswith("stderr: oops | Segmentation fault"), j.info.reason
