"""The ``orchestrator`` command line and its TOML job files, driven through click's CliRunner."""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import structlog
from click.testing import CliRunner, Result

from orchestrator import ArgSplitter, Backend, GenericSplitter, JobError, Orchestrator, TextMerger
from orchestrator.cli import cli
from orchestrator.cli.jobfile import JobFileError, load_job

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """The CLI points structlog at CliRunner's stderr: forget that after each test."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def run(home: Path, *args: str, code: int | None = 0) -> Result:
    result = CliRunner().invoke(cli, [*args, "--home", str(home)])
    if code is not None and result.exit_code != code:
        tb = "".join(traceback.format_exception(result.exception)) if result.exception else ""
        raise AssertionError(f"orchestrator {' '.join(args)}: exit {result.exit_code}, expected {code}\n"
                             f"stdout: {result.stdout}\nstderr: {result.stderr}\n{tb}")
    return result


def sim_file(tmp_path: Path, *, name: str = "simjob", n: int = 4, run_seconds: float = 0.05,
             backend_extra: str = "") -> Path:
    path = tmp_path / f"{name}.toml"
    values = ", ".join(f'["{i}"]' for i in range(n))
    path.write_text(f"""
name = "{name}"
[application]
exe = "/bin/echo"
[backend]
name = "sim"
run_seconds = {run_seconds}
{backend_extra}
[splitter]
type = "args"
args = [{values}]
""")
    return path


def submit(home: Path, path: Path, *extra: str, code: int = 0) -> str:
    result = run(home, "submit", str(path), *extra, code=code)
    return result.stdout.splitlines()[0].strip()


# ------------------------------------------------------------- happy paths
def test_submit_then_wait_then_jobs_lists_counts(tmp_path: Path, home: Path) -> None:
    job_id = submit(home, sim_file(tmp_path, n=4))
    assert job_id.isdigit()
    waited = run(home, "wait", job_id, "--timeout", "30")
    assert f"job {job_id} completed: 4/4 final (completed 4)" in waited.stdout
    listing = run(home, "jobs").stdout
    header, row = listing.splitlines()[:2]
    # sacct's way: fixed columns whatever the statuses, one header each (the counts, then the submission's time)
    assert header.split() == ["id", "name", "owner", "status", "backend", "subjobs", "pending", "running",
                              "completed", "failed", "killed", "held", "submit", "elapsed"]
    assert row.split()[:7] == [job_id, "simjob", pwd.getpwuid(os.getuid()).pw_name, "completed", "sim", "4", "4"]
    assert re.fullmatch(r"\d\d:\d\d:\d\d", row.split()[7]) and re.fullmatch(r"[\d.]+s", row.split()[8])


def test_submit_wait_exits_1_when_a_subjob_failed(tmp_path: Path, home: Path) -> None:
    path = sim_file(tmp_path, n=3, backend_extra='outcome = { 1 = "failed" }')
    result = run(home, "submit", str(path), "--wait", code=1)
    assert "failed: 3/3 final (completed 2  failed 1)" in result.stdout
    listing = run(home, "jobs", "--status", "failed").stdout
    assert "failed" in listing.splitlines()[0] and "simjob" in listing
    assert run(home, "jobs", "--status", "completed").stdout.strip() == "no jobs"


def test_show_master_and_subjob(tmp_path: Path, home: Path) -> None:
    job_id = submit(home, sim_file(tmp_path, n=3), "--wait")
    shown = run(home, "show", job_id).stdout
    for expected in ("simjob", "completed", "sim (", "run_seconds=0.05", "/bin/echo", "submit_counter",
                     "ArgSplitter", "subjobs         3: completed 3", f"{job_id}.0", f"{job_id}.2"):
        assert expected in shown, expected
    assert re.search(r"submitted\s+\d\d:\d\d:\d\d\s", shown)  # today's times as people read them
    assert re.search(r"elapsed\s+[\d.]+s", shown)
    sub = run(home, "show", f"{job_id}.1").stdout
    assert re.search(rf"master\s+{job_id}\b", sub)
    assert re.search(r"application\s+/bin/echo 1", sub)
    assert re.search(r"submit_counter\s+1", sub)
    assert re.search(r"backend_id\s+sim:", sub)
    assert str(home / "workspace" / job_id / "1" / "output") in sub


def test_show_lists_only_the_first_50_subjobs(tmp_path: Path, home: Path) -> None:
    job_id = submit(home, sim_file(tmp_path, n=60, run_seconds=0), "--wait")
    shown = run(home, "show", job_id).stdout
    assert f"{job_id}.49 " in shown and f"{job_id}.50 " not in shown
    assert "and 10 more subjobs" in shown


def test_kill_resubmit_remove(tmp_path: Path, home: Path) -> None:
    job_id = submit(home, sim_file(tmp_path, n=3, run_seconds=600))
    assert run(home, "kill", f"{job_id}.1").stdout.strip() == f"job {job_id}.1: killed"
    refused = run(home, "remove", job_id, code=2)
    assert "kill it first" in refused.stderr and "Traceback" not in refused.output
    assert run(home, "kill", job_id).stdout.strip() == f"job {job_id}: killed"
    none = run(home, "resubmit", job_id, code=3).stdout  # nothing to do: said, with its own exit code
    assert "no subjob to resubmit" in none and "--all" in none
    again = run(home, "resubmit", job_id, "--all").stdout
    assert again.strip() == f"job {job_id}: resubmitted 3 subjob(s); submitted"
    assert run(home, "kill", f"{job_id}.0").stdout.strip() == f"job {job_id}.0: killed"
    assert run(home, "resubmit", f"{job_id}.0").stdout.strip() == f"job {job_id}.0: resubmitted; submitted"
    shown = run(home, "show", f"{job_id}.0").stdout
    assert re.search(r"submit_counter\s+3", shown)
    run(home, "kill", job_id)
    assert run(home, "remove", job_id).stdout.strip() == f"job {job_id}: removed"
    assert run(home, "jobs").stdout.strip() == "no jobs"
    assert not (home / "workspace" / job_id).exists()


def test_wait_timeout_exits_1(tmp_path: Path, home: Path) -> None:
    job_id = submit(home, sim_file(tmp_path, n=2, run_seconds=600))
    result = run(home, "wait", job_id, "--timeout", "0.3", code=1)
    assert "timed out" in result.stderr
    assert f"job {job_id} submitted" in result.stdout or f"job {job_id} running" in result.stdout


def test_demo_prints_the_merged_output(home: Path) -> None:
    result = run(home, "demo", "--subjobs", "10")
    assert "10/10 final (completed 10)" in result.stdout
    merged = [line for line in result.stdout.splitlines() if line.startswith("subjob ")]
    assert merged == [f"subjob {i}: {i * i}" for i in range(10)]
    assert (home / "demo" / "demo.toml").is_file()


def test_scan_example_runs_locally(home: Path) -> None:
    job_id = submit(home, EXAMPLES / "scan.toml", "--wait")
    merged = (home / "workspace" / job_id / "output" / "stdout").read_text().splitlines()
    assert [line.split(":")[0] for line in merged] == [f"bin {i} [{i * 10}, {i * 10 + 9}]" for i in range(10)]
    histogram = (home / "workspace" / job_id / "output" / "histogram.txt").read_text().split()
    assert sum(int(n) for n in histogram[1::2]) == 500


def test_home_may_be_given_before_the_command(tmp_path: Path, home: Path) -> None:
    submit(home, sim_file(tmp_path))
    result = CliRunner().invoke(cli, ["--home", str(home), "jobs"])
    assert result.exit_code == 0 and "simjob" in result.stdout


# ------------------------------------------------------------------ errors
BAD_FILES = {
    "syntax": ('name = "x"\n[application\nexe = "/bin/echo"\n', "line 2"),
    "unknown-field": ('name = "x"\ncolour = "red"\n[application]\nexe = "/bin/echo"\n', "[field colour]"),
    "missing-exe": ('name = "x"\n[application]\nargs = ["a"]\n', "[field application.exe]"),
    "unknown-splitter": ('[application]\nexe = "/bin/echo"\n[splitter]\ntype = "nope"\n', "[field splitter.type]"),
    "splitter-params": ('[application]\nexe = "/bin/echo"\n[splitter]\ntype = "args"\nargz = [["a"]]\n',
                        "[field splitter.argz]"),
    "splitter-values": ('[application]\nexe = "/bin/echo"\n[splitter]\ntype = "args"\nargs = ["a"]\n',
                        "[field splitter.args]"),
    "wrong-type": ('name = 3\n[application]\nexe = "/bin/echo"\n', "[field name]"),
    "missing-input": ('inputfiles = ["nope.txt"]\n[application]\nexe = "/bin/echo"\n', "[field inputfiles]"),
    "backend-setting": ('[application]\nexe = "/bin/echo"\n[backend]\nname = "sim"\nrun_second = 1\n',
                        "[field backend.run_second]"),
    "unknown-merger": ('[application]\nexe = "/bin/echo"\n[merger]\ntype = "zip"\n', "[field merger.type]"),
    "retry": ('[application]\nexe = "/bin/echo"\n[retry]\nmax_early = -1\n', "[field retry.max_early]"),
    "metadata": ('metadata = "x"\n[application]\nexe = "/bin/echo"\n', "[field metadata]"),
    "missing-output": ('fail_on_missing_output = "no"\n[application]\nexe = "/bin/echo"\n',
                       "[field fail_on_missing_output]"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_job_file_exits_2_naming_file_and_field(case: str, tmp_path: Path, home: Path) -> None:
    text, expected = BAD_FILES[case]
    path = tmp_path / f"{case}.toml"
    path.write_text(text)
    result = run(home, "submit", str(path), code=2)
    err = result.stderr.strip()
    assert err.startswith(f"error: job file {path}: ") and expected in err
    assert len(err.splitlines()) == 1 and result.stdout == ""
    assert not (home / "repository.sqlite").exists()  # the home was never opened


def test_unreadable_job_file(tmp_path: Path, home: Path) -> None:
    result = run(home, "submit", str(tmp_path / "absent.toml"), code=2)
    assert f"job file {tmp_path / 'absent.toml'}: cannot read it" in result.stderr


def test_kill_of_a_finished_job_says_nothing_was_done(tmp_path: Path, home: Path) -> None:
    job_id = submit(home, sim_file(tmp_path, n=2, run_seconds=0), "--wait")
    done = run(home, "kill", job_id, code=3)  # NOTHING_TO_DO, documented in `orchestrator --help`
    assert "nothing to kill" in done.stdout and "completed" in done.stdout
    assert re.search(r"\b3\s+nothing to do", run(home, "--help").stdout)


def test_a_job_file_whose_executable_does_not_exist_leaves_nothing(tmp_path: Path, home: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('name = "bad"\n[application]\nexe = "/no/such/program"\n[backend]\nname = "local"\n')
    refused = run(home, "submit", str(path), code=2)
    assert "application.exe" in refused.stderr and "/no/such/program does not exist" in refused.stderr
    assert "Traceback" not in refused.output
    assert run(home, "jobs").stdout.strip() == "no jobs"


def test_unknown_ids_exit_2(tmp_path: Path, home: Path) -> None:
    home.mkdir()  # a home with no jobs yet (a reader never makes one: test_cli_ids)
    assert run(home, "show", "999", code=2).stderr.strip() == "error: no job 999"
    job_id = submit(home, sim_file(tmp_path, n=2), "--wait")
    assert run(home, "show", f"{job_id}.7", code=2).stderr.strip() == f"error: no job {job_id}.7"
    assert run(home, "kill", "42", code=2).stderr.strip() == "error: no job 42"
    assert "not a job id" in run(home, "show", "x.y", code=2).stderr


def test_refused_operation_exits_2(tmp_path: Path, home: Path) -> None:
    path = sim_file(tmp_path, n=2, backend_extra="bulk = false\nfail_submit = [0, 1]")
    failed = run(home, "submit", str(path), "--keep-going", code=2)
    assert "no subjob could be submitted" in failed.stderr and "Traceback" not in failed.output
    assert run(home, "jobs").stdout.strip() == "no jobs"  # a job file that could not run leaves nothing behind

    async def add() -> str:
        async with Orchestrator(home=home) as orch:
            return (await orch.jobs.add(load_job(path))).fqid

    job_id = anyio.run(add)
    assert "was never submitted" in run(home, "resubmit", job_id, code=2).stderr
    assert run(home, "wait", job_id, code=1).stdout.startswith(f"job {job_id} new")
    run(home, "remove", job_id)


HOLD = """
import anyio, sys
from orchestrator import Orchestrator
async def main() -> None:
    async with Orchestrator(home=sys.argv[1]):
        print("held", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the test closes our stdin
anyio.run(main)
"""


def test_locked_home_exits_2(tmp_path: Path, home: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(home)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        result = run(home, "submit", str(sim_file(tmp_path)), code=2)
        assert "is in use" in result.stderr and f"pid {holder.pid}" in result.stderr
        assert "Traceback" not in result.stderr
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)


# ----------------------------------------------------------------- load_job
def test_load_job_builds_the_job(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("a\n")
    (tmp_path / "run.sh").write_text("echo hi\n")
    path = tmp_path / "scan.toml"
    path.write_text("""
name = "scan"
inputfiles = ["data/a.txt"]
outputfiles = ["out.txt"]
mode = "test"
comment = "first pass"
metadata = { run = 42, tags = ["a"] }
fail_on_missing_output = false
[application]
exe = "./run.sh"
args = ["x", 2]
env = { A = "1", B = 2 }
[backend]
name = "sim"
run_seconds = 0.1
[splitter]
type = "generic"
attribute = "application.args"
values = [["a"], ["b"]]
[merger]
type = "text"
files = ["stdout", "out.txt"]
[retry]
max_early = 2
""")
    job = load_job(path)
    assert job.name == "scan" and job.mode == "test"
    assert job.inputfiles == [str(tmp_path / "data" / "a.txt")] and job.outputfiles == ["out.txt"]
    assert job.application is not None
    assert job.application.exe == str(tmp_path / "run.sh")
    assert job.application.args == ["x", "2"] and job.application.env == {"A": "1", "B": "2"}
    assert job.backend == Backend("sim", run_seconds=0.1)
    assert job.splitter == GenericSplitter("application.args", [["a"], ["b"]])
    assert isinstance(job.merger, TextMerger) and job.merger.files == ["stdout", "out.txt"]
    assert job.retry.max_early == 2
    assert job.comment == "first pass" and job.metadata == {"run": 42, "tags": ["a"]}
    assert job.fail_on_missing_output is False


def test_load_job_defaults_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text('backend = "sim"\n[application]\nexe = "echo"\n')
    job = load_job(path)
    assert job.name == "tiny" and job.backend == Backend("sim") and job.splitter is None
    assert job.application is not None and job.application.exe == "echo"
    path.write_text('[application]\nexe = "/bin/echo"\n[splitter]\ntype = "files"\nfiles_per_job = 0\n')
    with pytest.raises(JobError) as info:
        load_job(path)
    assert isinstance(info.value, JobFileError) and info.value.field == "splitter.files_per_job"
    assert str(info.value).startswith(f"job file {path}: files_per_job must be")


def test_examples_load() -> None:
    scan = load_job(EXAMPLES / "scan.toml")
    assert isinstance(scan.splitter, ArgSplitter) and len(scan.splitter.args) == 10
    assert scan.backend.name == "local" and all(Path(f).is_file() for f in scan.inputfiles)
    sim = load_job(EXAMPLES / "sim.toml")
    assert sim.backend.name == "sim" and isinstance(sim.splitter, GenericSplitter)


def test_release_resumes_a_held_job_with_new_args(tmp_path: Path) -> None:
    job = tmp_path / "hold.toml"
    job.write_text(
        'name = "h"\n[application]\nexe = "/bin/sh"\n'
        'args = ["-c", "if [ -z \\"$ORCH_RETRY_ARG_1\\" ]; then $ORCH_LOG HOLD wait; '
        'else echo $ORCH_RETRY_ARG_1; fi"]\n'
        '[backend]\nname = "local"\n'
    )
    home = ["--home", str(tmp_path / "home")]
    runner = CliRunner()
    assert runner.invoke(cli, ["submit", str(job), "--wait", *home]).exit_code == 1  # ends held, not completed
    shown = runner.invoke(cli, ["show", "0", *home])
    assert "held" in shown.output and "HOLD wait" in shown.output
    released = runner.invoke(cli, ["release", "0", "--arg", "go", *home])
    assert released.exit_code == 0, released.output
    assert runner.invoke(cli, ["wait", "0", *home]).exit_code == 0
    assert (tmp_path / "home" / "workspace" / "0" / "output" / "stdout").read_text() == "go\n"
