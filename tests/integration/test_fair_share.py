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
    many = ok("bin", home, "submit", str(jobfile(team_dir, "many", "/bin/sleep", ["4"], subjobs=40))).strip()
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
