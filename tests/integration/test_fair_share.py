"""Fair share and quotas of a team service (issue 22): runs waiting for a backend's slots are taken round-robin
by owner, not first come first served; ``[service] max_active_per_user`` and ``max_subjobs_per_master`` refuse a
request over them (409 naming the job, the field and the limit; exit 2 on the CLI) and store nothing.

Real OS users (``nobody``, ``bin``) run the command line against a root service on its Unix socket.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from served import Service, cli_ok, start
from test_service_owners import _user, as_user

from orchestrator.cli.jobfile import load_job


@pytest.fixture
def team_dir() -> Iterator[Path]:
    """A directory other users may traverse (pytest's tmp_path is 0700)."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser: the clients run as other OS users")
    for name in ("nobody", "bin"):
        _user(name)
    path = Path(tempfile.mkdtemp(prefix="orch-fair-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def jobfile(where: Path, name: str, exe: str, args: list[str] | None = None, subjobs: int = 0) -> Path:
    path = where / f"{name}.toml"
    text = (f'name = "{name}"\n[application]\nexe = "{exe}"\nargs = {json.dumps(args or [])}\n'
            '[backend]\nname = "local"\n')
    if subjobs:
        text += f'[splitter]\ntype = "args"\nargs = {json.dumps([[str(i)] for i in range(subjobs)])}\n'
    path.write_text(text)
    path.chmod(0o644)
    return path


def sleeper(where: Path, seconds: int) -> str:
    """A script that sleeps ``seconds`` whatever its arguments (a splitter's args replace the application's)."""
    path = where / f"sleep{seconds}.sh"
    path.write_text(f"#!/bin/sh\nexec sleep {seconds}\n")
    path.chmod(0o755)
    return str(path)


def team_home(where: Path, extra: str = "") -> Path:
    home = where / "home"
    home.mkdir()
    home.chmod(0o755)
    (home / "orchestrator.toml").write_text('[core]\npoll_interval = 0.05\n[service]\nusers = ["nobody", "bin"]\n'
                                            + extra)
    return home


def ok(user: str, home: Path, *args: str) -> str:
    done = as_user(user, home, *args)
    assert done.returncode == 0, (user, args, done.stderr)
    return done.stdout


def test_a_users_one_run_is_not_starved_by_anothers_queue(services: list[Service], team_dir: Path) -> None:
    """With max_running = 4, nobody's /bin/true completes within 10 s though bin queued 40 runs of 4 s before it
    (first come, first served, it would wait for all of them: 40 s)."""
    home = team_home(team_dir, "[backends.local]\nmax_running = 4\n")
    start(services, home)
    many = ok("bin", home, "submit", str(jobfile(team_dir, "many", sleeper(team_dir, 4), subjobs=40))).strip()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # bin's runs hold every slot, the rest wait
            shown = json.loads(cli_ok(home, "show", many, "--json"))
            if shown.get("counts", {}).get("running", 0) == 4:
                break
            time.sleep(0.2)
        began = time.monotonic()
        one = ok("nobody", home, "submit", "--wait", "--timeout", "60",
                 str(jobfile(team_dir, "one", "/bin/true"))).strip().splitlines()[0]
        took = time.monotonic() - began
        shown = json.loads(cli_ok(home, "show", one, "--json"))
        assert shown["status"] == "completed" and shown["owner"] == "nobody", shown
        assert took < 10, f"nobody's one run waited {took:.1f} s behind bin's queue"
        assert json.loads(cli_ok(home, "show", many, "--json"))["status"] != "completed"  # bin's still queued
    finally:
        cli_ok(home, "kill", many)


def test_quotas_refuse_a_request_over_them_and_store_nothing(services: list[Service], team_dir: Path) -> None:
    home = team_home(team_dir, "max_active_per_user = 3\nmax_subjobs_per_master = 5\n")
    service = start(services, home)
    wide = jobfile(team_dir, "wide", "/bin/true", subjobs=6)
    refused = as_user("bin", home, "submit", str(wide))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused
    assert "max_subjobs_per_master" in refused.stderr and "at most 5 per job" in refused.stderr, refused.stderr
    assert "makes 6 subjobs" in refused.stderr and "job 0:" in refused.stderr, refused.stderr

    failed = as_user("bin", home, "submit", "--wait", "--timeout", "30",
                     str(jobfile(team_dir, "failing", "/bin/false", subjobs=2)))
    assert failed.returncode == 1, failed  # it ended failed
    failing = failed.stdout.split()[0]
    three = ok("bin", home, "submit", str(jobfile(team_dir, "three", sleeper(team_dir, 30), subjobs=3))).strip()
    try:
        # A resubmission over the quota is refused whole too: its 2 failed subjobs stay failed.
        again = as_user("bin", home, "resubmit", failing)
        assert again.returncode == 2 and "max_active_per_user" in again.stderr, again
        assert "2 more active subjobs would make bin's 5 (3 now)" in again.stderr, again.stderr
        assert json.loads(cli_ok(home, "show", failing, "--json"))["counts"] == {"failed": 2}
        one = jobfile(team_dir, "one", "/bin/true")
        over = as_user("bin", home, "submit", str(one))
        assert over.returncode == 2 and "Traceback" not in over.stderr, over
        assert "max_active_per_user" in over.stderr and "at most 3 per user" in over.stderr, over.stderr
        assert "bin's 4 (3 now)" in over.stderr, over.stderr
        # Another user's quota is their own.
        theirs = ok("nobody", home, "submit", "--wait", "--timeout", "30", str(one)).strip().splitlines()[0]
        # Nothing of the refused requests was kept: bin's one job, nobody's one.
        listed = json.loads(cli_ok(home, "jobs", "--json"))["jobs"]
        assert sorted((j["fqid"], j["owner"]) for j in listed) == sorted([(failing, "bin"), (three, "bin"),
                                                                          (theirs, "nobody")])

        # Through the HTTP API: 409, naming the job, the field and the limit; the job stays new, unsplit.
        with service.client() as http:
            added = http.post("/api/add", json={"name": "wide", "spec": load_job(wide).spec()})
            assert added.status_code == 200, added.text
            fqid = added.json()["fqid"]
            answer = http.post("/api/submit", json={"fqid": fqid})
        assert answer.status_code == 409, answer.text
        body = answer.json()
        assert (body["error"], body["fqid"], body["field"]) == ("refused", fqid, "max_subjobs_per_master"), body
        assert "at most 5" in body["message"]
        shown = json.loads(cli_ok(home, "show", fqid, "--json"))
        assert (shown["status"], shown["subjobs"]) == ("new", 0), shown
    finally:
        cli_ok(home, "kill", three)
