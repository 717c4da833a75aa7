"""Text from a job never reaches a terminal raw: control characters in names, comments, metadata, reasons and a
run's files are shown as visible escapes (``\\x1b``) by ``jobs``, ``show``, ``peek`` and the errors, while
``--json`` stays the exact JSON of the values."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import anyio
import pytest

from orchestrator import Executable, Job, Orchestrator

EXE = str(Path(sys.executable).with_name("orchestrator"))
NAME = "a\x1b[2Jb"
#: Everything a hostile job may put where the CLI shows it: the screen cleared, a bell, a C1 CSI, the window's
#: title set, a backspace over text, the text reversed.
COMMENT = "c\x07d\x9b2Je\x1b]0;owned\x07f\x08g\u202eh"


def orch(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, "--home", str(home), *args], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def add_hostile_job(home: Path) -> str:
    async def main() -> str:
        async with Orchestrator(home=home) as o:
            job = await o.jobs.add(Job(name=NAME, comment=COMMENT, metadata={"k": "v\x1b[31m\x85"},
                                       application=Executable("/bin/sh", args=["-c", "printf 'x\\033[2Jy\\n'; exit 3"]),
                                       backend="local"))
            await job.submit()
            await job.wait(timeout=60)
            assert job.status == "failed"
            return job.fqid

    return anyio.run(main)


def test_jobs_and_show_escape_control_characters_and_json_stays_exact(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fqid = add_hostile_job(home)
    listing = orch(home, "jobs")
    shown = orch(home, "show", fqid)
    report = orch(home, "report", fqid)
    for done in (listing, shown, report):
        assert done.returncode == 0, done.stderr
        out = done.stdout
        assert not any(c in out for c in "\x1b\x07\x08\x9b\x85\u202e"), repr(out)
    assert "a\\x1b[2Jb" in listing.stdout
    assert "a\\x1b[2Jb" in shown.stdout
    assert "a\\x1b[2Jb" in report.stdout
    assert "c\\x07d\\x9b2Je\\x1b]0;owned\\x07f\\x08g\\u202eh" in shown.stdout
    assert "v\\u001b[31m\\x85" in shown.stdout  # JSON escapes C0 itself
    # --json: the values exactly, as JSON writes them.
    as_json = json.loads(orch(home, "jobs", "--json").stdout)
    assert as_json["jobs"][0]["name"] == NAME
    detail = json.loads(orch(home, "show", fqid, "--json").stdout)
    assert (detail["name"], detail["comment"], detail["metadata"]) == (NAME, COMMENT, {"k": "v\x1b[31m\x85"})
    # An error that quotes a value: escaped too.
    refused = orch(home, "show", "99")
    assert refused.returncode == 2 and "\x1b" not in refused.stderr


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_on_a_terminal_a_runs_file_is_shown_escaped_and_piped_as_it_is(tmp_path: Path) -> None:
    home = tmp_path / "home"
    fqid = add_hostile_job(home)
    piped = orch(home, "peek", fqid, "stdout")
    assert piped.stdout == "x\x1b[2Jy\n"  # to a pipe or a file: the bytes the run wrote
    session = f"orch-{uuid.uuid4().hex[:8]}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "80",
                    f"echo BEFORE; {EXE} --home {home} peek {fqid} stdout; {EXE} --home {home} show {fqid}; "
                    f"echo EXIT=$?; sleep 60"], check=True)
    try:
        deadline = time.monotonic() + 60
        while "EXIT=" not in (text := _screen(session)) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    assert "BEFORE" in text  # the screen was not cleared
    assert "x\\x1b[2Jy" in text and "a\\x1b[2Jb" in text, text
    assert "EXIT=0" in text


def _screen(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True,
                          check=True).stdout
