"""Several ids and ranges per command, homes a reader must not make or write, and filter values that match
nothing: the command line as a Slurm or Ganga user types it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from click.testing import CliRunner, Result

from orchestrator.cli import cli

EXE = str(Path(sys.executable).with_name("orchestrator"))


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def run(home: Path, *args: str, code: int | None = 0) -> Result:
    result = CliRunner().invoke(cli, [*args, "--home", str(home)])
    if code is not None:
        assert result.exit_code == code, (args, result.exit_code, result.stdout, result.stderr, result.exception)
    return result


def job_file(tmp_path: Path, *, n: int = 10, backend: str = 'name = "sim"\nrun_seconds = 30', name: str = "ids",
             exe: str = "/bin/echo") -> Path:
    path = tmp_path / f"{name}.toml"
    values = ", ".join(f'["{i}"]' for i in range(n))
    path.write_text(f'name = "{name}"\n[application]\nexe = "{exe}"\n[backend]\n{backend}\n'
                    f'[splitter]\ntype = "args"\nargs = [{values}]\n')
    return path


def statuses(home: Path, job: str) -> list[str]:
    shown = json.loads(run(home, "show", job, "--all", "--json").stdout)
    return [row["status"] for row in shown["subjob_rows"]]


def test_kill_takes_several_subjobs_and_a_bracket_range(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = run(home, "submit", str(job_file(tmp_path))).stdout.strip()
    said = run(home, "kill", f"{job}.1", f"{job}.4").stdout
    assert f"job {job}.1: killed" in said and f"job {job}.4: killed" in said
    said = run(home, "kill", f"{job}.[6-7,9]").stdout
    assert f"job {job}.[6,7,9]: killed 3 subjob(s); job {job}" in said
    seen = statuses(home, job)
    assert [i for i, s in enumerate(seen) if s == "killed"] == [1, 4, 6, 7, 9]
    # a range of subjobs resubmits them in one go; a dash range is the same as brackets
    said = run(home, "resubmit", "--all", f"{job}.6-7").stdout
    assert f"job {job}.[6-7]: resubmitted 2 subjob(s)" in said
    assert [i for i, s in enumerate(statuses(home, job)) if s == "killed"] == [1, 4, 9]


def test_a_range_past_the_last_subjob_acts_on_none(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = run(home, "submit", str(job_file(tmp_path, n=5))).stdout.strip()
    refused = run(home, "kill", f"{job}.0", f"{job}.3-9", code=2)
    assert f"job {job} has subjobs 0-4; no subjob {job}.5" in refused.stderr
    assert "killed" not in statuses(home, job)  # checked before anything was done: 3.0 was not killed either
    bad = run(home, "kill", f"{job}.[1", code=2)
    assert "3.[0-9,12]" in bad.stderr and "not a job id or range" in bad.stderr


def test_show_and_peek_take_several_ids(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = run(home, "submit", str(job_file(tmp_path, n=4, backend='name = "local"')), "--wait").stdout.split()[0]
    shown = json.loads(run(home, "show", f"{job}.0-2", "--json").stdout)
    assert [r["fqid"] for r in shown["shown"]] == [f"{job}.0", f"{job}.1", f"{job}.2"]
    one = json.loads(run(home, "show", f"{job}.3", "--json").stdout)
    assert one["fqid"] == f"{job}.3"  # one id: the same document as ever
    text = run(home, "peek", f"{job}.1", f"{job}.3", "stdout").stdout
    assert text == f"==> {job}.1 stdout <==\n1\n\n==> {job}.3 stdout <==\n3\n"
    assert run(home, "peek", f"{job}.2").stdout == "2\n"
    peeks = json.loads(run(home, "peek", f"{job}.[0,2]", "--json").stdout)["peeks"]
    assert [(p["fqid"], p["text"]) for p in peeks] == [(f"{job}.0", "0\n"), (f"{job}.2", "2\n")]


def test_force_status_and_release_take_ranges(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = run(home, "submit", str(job_file(tmp_path, n=6))).stdout.strip()
    said = run(home, "force-status", f"{job}.0-2", "failed").stdout
    assert f"job {job}.[0-2]: marked failed 3 subjob(s)" in said
    assert statuses(home, job)[:3] == ["failed"] * 3
    run(home, "force-status", f"{job}.0", "completed")
    assert statuses(home, job)[0] == "completed"
    with_help = run(home, "force-status", "--help").stdout
    assert "ID..." in with_help


def test_resubmit_of_a_running_job_says_what_to_do(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = run(home, "submit", str(job_file(tmp_path, n=2))).stdout.strip()
    refused = run(home, "resubmit", f"{job}.0", code=2)
    assert "kill it first, then resubmit it" in refused.stderr


def test_a_mistyped_home_is_said_and_not_made(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run(home, "submit", str(job_file(tmp_path, n=2)))
    typo = tmp_path / "hmoe"
    for args in (("jobs",), ("show", "0"), ("peek", "0.1"), ("report", "0"), ("checkpoint", "list", "0")):
        refused = run(typo, *args, code=2)
        assert f"no home at {typo}" in refused.stderr, args
    assert not typo.exists()


def test_a_filter_that_matches_nothing_known_is_an_error_with_a_suggestion(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run(home, "submit", str(job_file(tmp_path, n=2)))
    refused = run(home, "jobs", "--backend", "lcoal", code=2)
    assert "no backend 'lcoal' (did you mean 'local'?)" in refused.stderr
    refused = run(home, "jobs", "--owner", "rooot", code=2)
    assert "no owner 'rooot'" in refused.stderr and "did you mean" in refused.stderr
    assert run(home, "jobs", "--backend", "slurm").stdout.strip() == "no jobs"  # known, merely unused
    run(home, "jobs", "--status", "runing", code=2)


def test_submit_quiet_prints_the_id_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = subprocess.run([EXE, "--home", str(home), "submit", str(job_file(tmp_path, n=3, backend='name = "local"')),
                           "--wait", "--parsable"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "0\n" and done.stderr == ""


def test_kill_and_wait_without_a_service_print_nothing_on_stderr(tmp_path: Path) -> None:
    """The orchestrator's own warnings (here: a merger that finds nothing to merge) are for the log (-v), not
    for the user's terminal, where the job's line already says why it failed."""
    home = tmp_path / "home"
    jobfile = job_file(tmp_path, n=3, backend='name = "local"', exe="/bin/sleep")
    jobfile.write_text(jobfile.read_text().replace('["0"], ["1"], ["2"]', '["0"], ["30"], ["30"]')
                       + '[merger]\ntype = "text"\nfiles = ["nothing-here.txt"]\n')
    job = subprocess.run([EXE, "--home", str(home), "submit", str(jobfile)], capture_output=True, text=True,
                         timeout=60).stdout.strip()
    for args in (("kill", f"{job}.1"), ("wait", job, "--timeout", "0.5"), ("kill", job), ("wait", job)):
        done = subprocess.run([EXE, "--home", str(home), *args], capture_output=True, text=True, timeout=60)
        assert done.stderr in ("", f"timed out after 0.5 s; job {job} goes on\n"), (args, done.stderr)
    assert "TextMerger: subjobs 1, 2 did not complete" in done.stdout  # the reason is on the job's line


@pytest.fixture
def read_only_view(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A home, and the same directory bind-mounted read-only (a snapshot, a CD): root and mount needed."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount for a read-only bind mount")
    home, view = tmp_path / "home", tmp_path / "view"
    home.mkdir()
    view.mkdir()
    if subprocess.run(["mount", "--bind", str(home), str(view)], capture_output=True).returncode != 0:
        pytest.skip("bind mounts are not allowed here")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True, capture_output=True)
        yield home, view
    finally:
        subprocess.run(["umount", str(view)], check=False)


def test_readers_read_a_home_on_read_only_media(tmp_path: Path, read_only_view: tuple[Path, Path]) -> None:
    home, view = read_only_view
    job = run(home, "submit", str(job_file(tmp_path, n=2, backend='name = "local"')), "--wait").stdout.split()[0]
    listing = run(view, "jobs", "--json").stdout
    assert [j["status"] for j in json.loads(listing)["jobs"]] == ["completed"]
    assert "completed" in run(view, "show", job).stdout
    assert run(view, "peek", f"{job}.1").stdout == "1\n"
    run(view, "report", job)
    run(view, "checkpoint", "list", job)
    refused = run(view, "kill", job, code=2)
    assert "Read-only file system" in refused.stderr


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_show_all_pages_with_colours_when_less_is_unset(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = run(home, "submit", str(job_file(tmp_path, n=80))).stdout.strip()
    session = f"orch-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if k not in ("LESS", "PAGER")}
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "30", "-e", "LESS=",
                    f"env -u LESS -u PAGER {EXE} --home {home} show {job} --all"], check=True, env=env)
    try:
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            text = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True,
                                  check=True).stdout
            if f"{job}.1" in text:
                break
            time.sleep(0.2)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    assert f"{job}.1" in text, text
    assert "ESC[" not in text and "\x1b[" not in text, text
