"""The minimal plugin printed in ``docs/plugins.md`` works as printed.

The guide marks each file of its example distribution with an HTML comment
(``<!-- file: PATH -->``) just before the code block. This module copies
those blocks into a fresh directory, pip-installs it into the running
interpreter's environment, asks the core to look for plugins again, runs a
split job on the new backend, and uninstalls it at the end. A guide whose
example does not install or run fails here, not in a reader's hands.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from plugin_install import installed

from orchestrator import ArgSplitter, Backend, Executable, Job, JobError, Orchestrator, plugins

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
DIST = "orchestrator-minimal-backend"
MODULE = "orch_minimal"
BLOCK = re.compile(r"<!-- file: (?P<path>[\w./-]+) -->\n```\w*\n(?P<code>.*?)\n```", re.DOTALL)

pytestmark = pytest.mark.anyio
#: The guide's test file that runs the conformance kit on the plugin.
CONFORMANCE = "test_conformance_minimal.py"


def guide_files() -> dict[str, str]:
    """``{relative path: text}`` of every marked code block in the guide."""
    return {m["path"]: m["code"] + "\n" for m in BLOCK.finditer(GUIDE.read_text())}


def test_guide_has_a_complete_minimal_plugin_under_60_lines() -> None:
    files = guide_files()
    assert set(files) == {f"{MODULE}/__init__.py", "pyproject.toml", CONFORMANCE}
    code = files[f"{MODULE}/__init__.py"]
    assert len(code.splitlines()) < 60
    compile(code, "orch_minimal/__init__.py", "exec")  # complete: no "..." placeholders that do not run
    assert "..." not in code
    assert f'minimal = "{MODULE}:MinimalDriver"' in files["pyproject.toml"]


@pytest.fixture(scope="module")
def minimal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The guide's plugin, installed from the guide's own text for this module's tests."""
    src = tmp_path_factory.mktemp("guide") / "orchestrator-minimal-backend"
    for path, text in guide_files().items():
        if path == CONFORMANCE:
            continue  # the plugin's test, not part of its distribution
        target = src / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    with installed(src, DIST, MODULE):
        yield


@pytest.mark.parametrize("keep_going", [True, False])
async def test_split_job_runs_on_the_guide_plugin(minimal: None, tmp_path: Path, keep_going: bool) -> None:
    assert "minimal" in plugins.backend_names()
    assert plugins.driver_class("minimal").__module__ == MODULE
    script = 'echo "$0 $ORCH_RETRY_COUNT"; [ "$0" != 2 ]'
    async with Orchestrator(home=tmp_path, config={"core": {"poll_interval": 0.05}}) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh"), backend=Backend("minimal"),
                                    splitter=ArgSplitter([["-c", script, str(i)] for i in range(4)])))
        await j.submit(keep_going=keep_going)
        await j.wait(timeout=30)
        assert [s.status for s in j.subjobs] == ["completed", "completed", "failed", "completed"]
        assert j.status == "failed"
        assert [(s.outputdir / "stdout").read_text() for s in j.subjobs] == [f"{i} 0\n" for i in range(4)]
        assert j.subjobs[2].info.history[-1]["level"] == "application"  # judged from the wrapper's log
        await j.subjobs[2].resubmit()
        await j.wait(timeout=30)
        assert j.subjobs[2].status == "failed" and (j.subjobs[2].outputdir / "stdout").read_text() == "2 1\n"


async def test_kill_and_settings_on_the_guide_plugin(minimal: None, tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path, config={"core": {"poll_interval": 0.05}}) as orch:
        with pytest.raises(JobError) as info:
            await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("minimal", shell="sh")))
        assert info.value.field == "backend.shell"
        with pytest.raises(JobError) as info:
            await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("minimal", colour=1)))
        assert info.value.field == "backend.colour"
        j = await orch.jobs.add(Job(application=Executable("/bin/sleep"), backend=Backend("minimal", shell="/bin/sh"),
                                    splitter=ArgSplitter([["60"]] * 3)))
        await j.submit()
        await orch.refresh()
        await j.kill()
        assert [s.status for s in j.subjobs] == ["killed"] * 3 and j.status == "killed"


def test_the_guide_runs_the_conformance_kit_on_its_plugin(minimal: None, tmp_path: Path) -> None:
    """The guide's conformance test file and command, as written, run the kit's checks on the guide's plugin."""
    (tmp_path / CONFORMANCE).write_text(guide_files()[CONFORMANCE])
    command = re.search(r"```sh\n(pytest -p orchestrator.plugin.testing [^\n]+)\n```", GUIDE.read_text())
    assert command is not None and command[1].endswith(CONFORMANCE)
    argv = command[1].split()
    out = subprocess.run([sys.executable, "-m", *argv, "-q", "-p", "no:cacheprovider", "-k",
                          "bulk_submit or exit_codes or checkpoint_states_harvested_at_the_end or mid_run"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "4 passed" in out.stdout, out.stdout[-2000:]
