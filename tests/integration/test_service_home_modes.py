"""A team's home that its users may only cross (mode 0711, root's): every command a listed user runs works
through the service, workflows included, without listing or opening the home's files; a workflow is its
submitter's, and another user neither sees nor touches it.

Real OS users (``orch-alice``, ``orch-bob``, made by ``scripts/install-test-deps.sh``) run the command line with
``runuser``; the service is a real ``orchestrator serve`` subprocess, stopped by its PID.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from served import Service, cli_ok, start
from test_service_owners import _user, as_user

USERS = ("orch-alice", "orch-bob")

WORKFLOW = """
id = "{id}"
backend = {{ name = "sim", run_seconds = {seconds} }}

[[stage]]
[[stage.line]]
[[stage.line.binary]]
name = "make"
executable = "/bin/true"
outputs = ["a.dat"]

[[stage]]
[[stage.line]]
[[stage.line.binary]]
name = "use"
executable = "/bin/true"
inputs = ["a.dat"]
"""


@pytest.fixture
def crossable() -> Iterator[Path]:
    """A directory every user may cross and read (the job and workflow files go there), the home inside it."""
    path = Path(tempfile.mkdtemp(prefix="orch-modes-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _needs_root() -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser: the clients must run as other OS users")
    for name in USERS:
        _user(name)


def _file(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o644)
    return path


def test_listed_users_work_with_execute_only_permission_on_the_home(services: list[Service],
                                                                    crossable: Path) -> None:
    _needs_root()
    home = crossable / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text('[core]\npoll_interval = 0.05\n[service]\n'
                                            f'users = ["{USERS[0]}", "{USERS[1]}"]\n')
    service = start(services, home)
    home.chmod(0o711)  # the docs' promise: users need only to cross it
    assert stat.S_IMODE(home.stat().st_mode) == 0o711 and home.stat().st_uid == 0
    quick = _file(crossable / "quick.toml", 'name = "quick"\n[application]\nexe = "/bin/true"\n'
                                            '[backend]\nname = "sim"\nrun_seconds = 0.05\n')
    slow = _file(crossable / "slow.toml", 'name = "slow"\n[application]\nexe = "/bin/true"\n'
                                          '[backend]\nname = "sim"\nrun_seconds = 600\n')

    def ok(user: str, *args: str) -> str:
        done = as_user(user, home, *args)
        assert done.returncode == 0, (user, args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
        return done.stdout

    alice, bob = USERS
    done_id = ok(alice, "submit", str(quick), "--wait").splitlines()[0]
    running = ok(alice, "submit", str(slow)).strip()
    assert {j["fqid"]: j["owner"] for j in json.loads(ok(alice, "jobs", "--json"))["jobs"]} == {
        done_id: alice, running: alice}
    assert ["owner", alice] in [line.split() for line in ok(alice, "show", done_id).splitlines()]
    assert f"job {done_id} completed" in ok(alice, "wait", done_id)
    assert ok(alice, "kill", running).strip() == f"job {running}: killed"
    assert ok(bob, "jobs").strip() == "no jobs"

    # Workflows, through the service: alice's are hers, and so are their packages' jobs.
    flow = _file(crossable / "flow.toml", WORKFLOW.format(id="flow", seconds=0.05))
    long = _file(crossable / "long.toml", WORKFLOW.format(id="long", seconds=600))
    assert ok(alice, "workflow", "submit", str(flow), "--wait", "--timeout", "60").splitlines() == [
        "flow", "workflow flow completed"]
    assert ok(alice, "workflow", "submit", str(long)).strip() == "long"
    listed = ok(alice, "workflow", "list")
    assert "flow  completed  2 packages: completed 2" in listed and "long  running" in listed, listed
    tree = ok(alice, "workflow", "show", "flow")
    assert "package 1.1.1  completed  [make]" in tree and "package 2.1.1  completed  [use]" in tree, tree
    owners = {j["name"]: j["owner"] for j in json.loads(ok(alice, "jobs", "--json"))["jobs"]}
    assert owners["flow/1.1.1"] == owners["flow/2.1.1"] == owners["long/1.1.1"] == alice, owners
    assert "killed: 1.1.1" in ok(alice, "workflow", "kill-line", "long", "1.1")
    assert "PARENT S1_L1_P1 CHILD S2_L1_P1" in ok(alice, "workflow", "dagman", "flow")
    _eventually(lambda: "long  running" not in ok(alice, "workflow", "list"))

    # bob sees none of it, and may not act on it.
    assert ok(bob, "workflow", "list").strip() == "no workflows"
    for command in (["show", "flow"], ["kill-line", "long", "1.1"], ["hold", "flow"], ["wait", "flow"]):
        refused = as_user(bob, home, "workflow", *command)
        assert refused.returncode == 2, (command, refused)
        assert f"no workflow '{command[1]}'" in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    taken = _file(crossable / "taken.toml", WORKFLOW.format(id="flow", seconds=0.05))
    refused = as_user(bob, home, "workflow", "submit", str(taken))
    assert refused.returncode == 2 and "is taken" in refused.stderr, refused.stderr
    # A file the service would fetch as itself (prefetch) is refused in a user's workflow: it would read as root.
    secret = crossable / "secret.dat"
    _file(secret, "root's only\n").chmod(0o600)
    prefetch = _file(crossable / "prefetch.toml", WORKFLOW.format(id="grab", seconds=0.05).replace(
        'name = "make"', f'name = "make"\ninputs = [{{ name = "s.dat", locator = "{secret}", acquisition = '
                         f'"prefetch" }}]'))
    refused = as_user(alice, home, "workflow", "submit", str(prefetch))
    assert refused.returncode == 2 and "prefetch is done by the service" in refused.stderr, refused.stderr
    assert not (home / "workflows" / "grab").exists()
    # Requests of the wrong shape are refused, never a 5xx.
    with service.client() as raw:
        assert raw.post("/api/workflow/nonsense", json={}).status_code == 404
        for body in ({"workflow": [1]}, {"workflow": {"stages": 3}}, {"wf_id": "flow", "extra": 1}, [1]):
            answer = raw.post("/api/workflow/submit" if "workflow" in str(body) else "/api/workflow/show", json=body)
            assert answer.status_code in (400, 409), (body, answer.status_code, answer.text)
    # The service's own user (an admin) sees every workflow, with its owner.
    assert "flow  completed  2 packages: completed 2  owner orch-alice" in cli_ok(home, "workflow", "list")


def _eventually(check: Callable[[], bool], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.2)

