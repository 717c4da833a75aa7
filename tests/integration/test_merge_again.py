"""A merged master whose failed subjobs are resubmitted merges again over every subjob, replacing its own
earlier output, as Ganga's mergers do; ``orchestrator merge ID`` runs the postprocessors again on demand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from click.testing import CliRunner, Result

from orchestrator import ArgSplitter, Executable, Job, JobError, Orchestrator, TextMerger
from orchestrator.cli import cli

#: Subjob 2 fails until the file ``fix`` exists beside the home; each subjob writes its index to result.txt.
SCRIPT = 'test "$0" != 2 || test -e "{fix}" || exit 1; echo "$0" > result.txt'


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def run(home: Path, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, [*args, "--home", str(home)])
    assert result.exit_code == code, (args, result.exit_code, result.stdout, result.stderr, result.exception)
    return result


def job_file(tmp_path: Path) -> Path:
    script = SCRIPT.format(fix=tmp_path / "fix")
    path = tmp_path / "merged.toml"
    path.write_text(f"""name = "merged"
outputfiles = ["result.txt"]
fail_on_missing_output = false
[application]
exe = "/bin/sh"
[backend]
name = "local"
[splitter]
type = "args"
args = [{", ".join(f"['-c', '{script}', '{i}']" for i in range(4))}]
[merger]
type = "text"
files = ["result.txt"]
ignorefailed = true
""")
    return path


def test_resubmitting_into_a_merged_master_merges_every_subjob_again(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = run(home, "submit", str(job_file(tmp_path)), "--wait", code=1).stdout.split()[0]
    merged = home / "workspace" / job / "output" / "result.txt"
    assert merged.read_text().split() == ["0", "1", "3"]
    (tmp_path / "fix").touch()
    run(home, "resubmit", job)
    waited = run(home, "wait", job).stdout
    assert f"job {job} completed: 4/4 final (completed 4)" in waited, waited
    assert merged.read_text().split() == ["0", "1", "2", "3"]


def test_merge_runs_the_postprocessors_again_on_demand(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = run(home, "submit", str(job_file(tmp_path)), "--wait", code=1).stdout.split()[0]
    merged = home / "workspace" / job / "output" / "result.txt"
    merged.write_text("spoilt\n")  # its own output, changed by hand: merged anew
    said = run(home, "merge", job).stdout
    assert said.startswith(f"job {job}: merged; failed"), said
    assert merged.read_text().split() == ["0", "1", "3"]
    refused = run(home, "merge", f"{job}.1", code=2)
    assert "name the master" in refused.stderr


def test_a_file_the_merger_did_not_write_is_still_kept(tmp_path: Path) -> None:
    home = tmp_path / "home"

    async def main() -> None:
        async with Orchestrator(home=home) as orch:
            j = await orch.jobs.add(Job(name="kept", application=Executable("/bin/echo"),
                                        splitter=ArgSplitter([["a"], ["b"]]), merger=TextMerger(files=["stdout"]),
                                        backend="local"))
            j.outputdir.mkdir(parents=True, exist_ok=True)
            (j.outputdir / "stdout").write_text("the user's own\n")
            await j.submit()
            await j.wait(timeout=60)
            assert j.status == "failed" and "exists (overwrite=False)" in (j.info.reason or "")
            assert (j.outputdir / "stdout").read_text() == "the user's own\n"
            with pytest.raises(JobError, match="has no merger"):
                other = await orch.jobs.add(Job(name="plain", application=Executable("/bin/true"),
                                                splitter=ArgSplitter([["a"]]), backend="local"))
                await other.submit()
                await other.wait(timeout=60)
                await other.merge()

    import anyio

    anyio.run(main)
