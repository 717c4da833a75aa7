"""Work runs as its owner on the ``slurm`` backend (issue 22): a root service admits orch-alice; her job, submitted
through the command line as her, is ``sbatch``ed as her, so Slurm records her as the job's user, and its run's
``id -u`` is hers; killing it is her ``scancel``.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from served import Service, cli_ok, start
from slurmd import SlurmCluster, slurm_cluster  # noqa: F401 - the session fixture, used by name
from test_service_owners import _user, as_user

ALICE = "orch-alice"


@pytest.fixture
def team_dir() -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser: the client and the runs are another OS user")
    _user(ALICE)
    path = Path(tempfile.mkdtemp(prefix="orch-slurm-owners-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def jobfile(where: Path, cluster: SlurmCluster, name: str, exe: str, args: list[str]) -> Path:
    path = where / f"{name}.toml"
    path.write_text(f'name = "{name}"\n[application]\nexe = "{exe}"\nargs = {json.dumps(args)}\n'
                    f'[backend]\nname = "slurm"\nslurm_conf = "{cluster.conf}"\n')
    path.chmod(0o644)
    return path


def slurm_user(cluster: SlurmCluster, job: str) -> str:
    """The job's user as Slurm has it (squeue while it is known, else the job-completion record)."""
    out = subprocess.run(["squeue", "-h", "--states=all", "-j", job, "-o", "%u"], env=cluster.env,
                         capture_output=True, text=True).stdout.split()
    if out:
        return out[0]
    done = subprocess.run(["sacct", "-c", "-n", "-P", "-j", job, "-o", "User"], env=cluster.env,
                          capture_output=True, text=True).stdout.split()
    return done[0] if done else ""


def test_an_owners_slurm_job_is_theirs_in_slurm(services: list[Service], team_dir: Path,
                                                 slurm_cluster: SlurmCluster) -> None:  # noqa: F811
    home = team_dir / "home"
    home.mkdir()
    home.chmod(0o755)
    (home / "orchestrator.toml").write_text(f'[core]\npoll_interval = 0.25\n[service]\nusers = ["{ALICE}"]\n')
    start(services, home)
    done = as_user(ALICE, home, "submit", "--wait", "--timeout", "90",
                   str(jobfile(team_dir, slurm_cluster, "id", "/usr/bin/id", ["-u"])))
    assert done.returncode == 0, (done.stdout, done.stderr)
    fqid = done.stdout.split()[0]
    shown = json.loads(cli_ok(home, "show", fqid, "--json"))
    assert (shown["status"], shown["owner"]) == ("completed", ALICE), shown
    assert cli_ok(home, "peek", fqid).strip() == str(pwd.getpwnam(ALICE).pw_uid)
    assert slurm_user(slurm_cluster, shown["backend_id"]) == ALICE

    # Her long job, killed: cancelled by her scancel (Slurm lets a user cancel only her own jobs).
    sleeper = as_user(ALICE, home, "submit", str(jobfile(team_dir, slurm_cluster, "long", "/bin/sleep", ["300"])))
    assert sleeper.returncode == 0, sleeper.stderr
    long_id = sleeper.stdout.split()[0]
    deadline = time.monotonic() + 60
    while not json.loads(cli_ok(home, "show", long_id, "--json"))["backend_id"] and time.monotonic() < deadline:
        time.sleep(0.2)
    native = json.loads(cli_ok(home, "show", long_id, "--json"))["backend_id"]
    assert slurm_user(slurm_cluster, native) == ALICE
    killed = as_user(ALICE, home, "kill", long_id)
    assert killed.returncode == 0, killed.stderr
    as_user(ALICE, home, "wait", long_id, "--timeout", "60")
    assert json.loads(cli_ok(home, "show", long_id, "--json"))["status"] == "killed"
