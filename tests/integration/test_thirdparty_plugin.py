"""A backend from a separately installed distribution works like a built-in one.

``tests/support/thirdparty_plugin/`` is its own distribution (``orchestrator-echo-backend``)
that registers the backend ``thirdparty`` through the entry-point group
``orchestrator.backends`` and nothing else. This module pip-installs it into
the running interpreter's environment, asks the core to look for plugins
again, runs jobs on it, and uninstalls it at the end.

The driver declares no native bulk ability, so submission, kill and status
all go through the core's emulated bulk.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from plugin_install import installed

from orchestrator import ArgSplitter, Backend, Executable, Job, JobError, Orchestrator, TextMerger, plugins

PLUGIN_SRC = Path(__file__).resolve().parents[1] / "support" / "thirdparty_plugin"
DIST = "orchestrator-echo-backend"
MODULE = "orch_thirdparty_echo"
WORDS = ["alpha", "bravo", "charlie", "delta", "echo"]
#: Each subjob prints "$GREETING <word>": the greeting setting reaches the run.
SAY = 'echo "$GREETING $1"'

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def thirdparty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The plugin distribution, installed for this module's tests only."""
    # Build from a copy, so that the build leaves nothing in the source tree.
    src = tmp_path_factory.mktemp("thirdparty") / "orchestrator-echo-backend"
    shutil.copytree(PLUGIN_SRC, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    with installed(src, DIST, MODULE):
        yield


def _say(words: list[str]) -> ArgSplitter:
    return ArgSplitter([["-c", SAY, "sh", w] for w in words])


async def test_registered_through_entry_point_only(thirdparty: None) -> None:
    dist = importlib.metadata.distribution(DIST)
    eps = [ep for ep in dist.entry_points if ep.group == plugins.BACKENDS]
    assert [(ep.name, ep.value) for ep in eps] == [("thirdparty", f"{MODULE}:EchoDriver")]
    assert "thirdparty" in plugins.backend_names()
    cls = plugins.driver_class("thirdparty")
    assert cls.__module__ == MODULE
    # The installed copy, not the source tree of this repository.
    module_file = Path(sys.modules[MODULE].__file__ or "")
    assert PLUGIN_SRC.resolve() not in module_file.resolve().parents
    caps = cls.capabilities
    assert not (caps.bulk_submit or caps.bulk_kill or caps.bulk_status)


@pytest.mark.parametrize("keep_going", [True, False])
async def test_split_job_runs_and_merges(thirdparty: None, tmp_path: Path, keep_going: bool) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        j = await orch.jobs.add(Job(name="greet", application=Executable("/bin/sh"), splitter=_say(WORDS),
                                    merger=TextMerger(), backend=Backend("thirdparty", greeting="hi")))
        assert j.backend.settings == {"greeting": "hi"}
        await j.submit(keep_going=keep_going)
        assert len(j.subjobs) == len(WORDS)
        await j.wait(timeout=60)
        assert [s.status for s in j.subjobs] == ["completed"] * len(WORDS), [s.info.reason for s in j.subjobs]
        assert j.status == "completed"
        for s, w in zip(j.subjobs, WORDS, strict=True):
            assert s.backend_id is not None and s.backend_id.startswith("thirdparty:")
            assert (s.outputdir / "stdout").read_text() == f"hi {w}\n"
        assert (j.outputdir / "stdout").read_text() == "".join(f"hi {w}\n" for w in WORDS)


async def test_exit_code_decides_outcome(thirdparty: None, tmp_path: Path) -> None:
    splitter = ArgSplitter([["-c", "echo ok"], ["-c", "echo bad >&2; exit 3"], ["-c", "echo ok"]])
    async with Orchestrator(home=tmp_path) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh"), splitter=splitter, backend="thirdparty"))
        await j.submit(keep_going=True)
        await j.wait(timeout=60)
        assert [s.status for s in j.subjobs] == ["completed", "failed", "completed"]
        assert j.status == "failed"
        assert "3" in (j.subjobs[1].info.reason or "")
        assert (j.subjobs[1].outputdir / "stderr").read_text() == "bad\n"


async def test_emulated_kill(thirdparty: None, tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sleep"), splitter=ArgSplitter([["60"]] * 3),
                                    backend="thirdparty"))
        await j.submit(keep_going=True)
        with anyio.fail_after(30):
            while j.status != "running":
                await anyio.sleep(0.05)
        await j.kill()
        await j.wait(timeout=30)
        assert [s.status for s in j.subjobs] == ["killed"] * 3
        assert j.status == "killed"


async def test_unknown_setting_is_refused_at_add(thirdparty: None, tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        with pytest.raises(JobError, match="colour") as info:
            await orch.jobs.add(Job(application=Executable("/bin/true"),
                                    backend=Backend("thirdparty", greeting="hi", colour="red")))
        assert info.value.field == "backend.colour"
        with pytest.raises(JobError, match="greeting") as info:
            await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("thirdparty", greeting=3)))
        assert info.value.field == "backend.greeting"
        assert len(orch.jobs.select()) == 0
