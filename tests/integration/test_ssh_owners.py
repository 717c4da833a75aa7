"""Work runs as its owner on the ``ssh`` backend (issue 22): a root service admits orch-alice and orch-bob; each
submits through the command line (run as that OS user, on the service's socket) a job whose settings name a key
and a known_hosts file in their own ~/.ssh; each run logs in as its owner with the owner's key (read with the
owner's rights), the host key still checked, and ``id -u`` on the host says so.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from served import Service, cli_ok, start
from sshd import SshEnv, allow_login, write_key
from test_service_owners import _user, as_user

from orchestrator import Backend, Executable, Job

OWNERS = ("orch-alice", "orch-bob")


@pytest.fixture
def team_dir() -> Iterator[Path]:
    """A directory every user may traverse and write, sticky (the service's home, the remote work dir)."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser: the clients and the runs are other OS users")
    for name in OWNERS:
        _user(name)
        allow_login(name)
    path = Path(tempfile.mkdtemp(prefix="orch-ssh-owners-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def give_keys(user: str, env: SshEnv, trust: bool = True) -> Path:
    """``user``'s own ~/.ssh: a key pair the sshd accepts, and a known_hosts trusting the host (or not).

    The user is a real one that another copy of the suite may be using at the same time: its key is kept once
    made, and only the lines of this test's hosts are replaced in its known_hosts."""
    entry = pwd.getpwnam(user)
    ssh = Path(entry.pw_dir) / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    key = ssh / "id_ed25519"
    if not key.exists() or not Path(f"{key}.pub").exists():
        write_key(key)
    public_line = (ssh / "id_ed25519.pub").read_text()
    authorized = ssh / "authorized_keys"
    if not authorized.exists() or public_line.strip() not in authorized.read_text():
        with open(authorized, "a") as f:
            f.write(public_line if public_line.endswith("\n") else public_line + "\n")
    if trust:
        lines = {f"[127.0.0.1]:{sshd.port}": sshd.known_hosts_line() for sshd in env.sshds}
    else:  # another host's key under this host's name
        other = env.base / "impostor"
        write_key(other)
        public = " ".join(Path(f"{other}.pub").read_text().split()[:2])
        lines = {f"[127.0.0.1]:{env.sshds[0].port}": f"[127.0.0.1]:{env.sshds[0].port} {public}\n"}
    known = ssh / "known_hosts"
    kept = [line for line in (known.read_text().splitlines(keepends=True) if known.exists() else [])
            if line.split(" ", 1)[0] not in lines]
    known.write_text("".join(kept) + "".join(lines.values()))
    for path in (ssh, *ssh.iterdir()):
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return ssh


def remote_workdir(where: Path) -> Path:
    work = where / "remote"
    work.mkdir()
    work.chmod(0o1777)  # like /tmp: each owner makes their own directory in it
    return work


def jobfile(where: Path, user: str, env: SshEnv, work: Path) -> Path:
    path = where / f"{user}.toml"
    path.write_text(f'name = "{user}-id"\n[application]\nexe = "/usr/bin/id"\nargs = ["-u"]\n[backend]\n'
                    f'name = "ssh"\nhost = "127.0.0.1:{env.sshds[0].port}"\nkey = "~/.ssh/id_ed25519"\n'
                    f'workdir = "{work}"\n')  # known_hosts: the default, the owner's ~/.ssh/known_hosts
    path.chmod(0o644)
    return path


def team_home(where: Path) -> Path:
    home = where / "home"
    home.mkdir()
    home.chmod(0o755)
    (home / "orchestrator.toml").write_text(
        f'[core]\npoll_interval = 0.1\n[service]\nusers = {json.dumps(list(OWNERS))}\n')
    return home


def test_each_users_ssh_run_logs_in_as_its_owner(services: list[Service], team_dir: Path, ssh_env: SshEnv) -> None:
    for user in OWNERS:
        give_keys(user, ssh_env)
    work = remote_workdir(team_dir)
    home = team_home(team_dir)
    start(services, home)
    for user in OWNERS:
        done = as_user(user, home, "submit", "--wait", "--timeout", "60", str(jobfile(team_dir, user, ssh_env, work)))
        assert done.returncode == 0, (user, done.stdout, done.stderr)
        fqid = done.stdout.split()[0]
        shown = json.loads(cli_ok(home, "show", fqid, "--json"))
        assert (shown["status"], shown["owner"]) == ("completed", user), shown
        assert cli_ok(home, "peek", fqid).strip() == str(pwd.getpwnam(user).pw_uid), user  # its uid on the host
        assert shown["backend_id"].endswith(f"@{user}@127.0.0.1:{ssh_env.sshds[0].port}"), shown["backend_id"]


def test_an_owners_key_they_cannot_read_or_an_untrusted_host_is_refused(services: list[Service], team_dir: Path,
                                                                       ssh_env: SshEnv) -> None:
    alice, bob = OWNERS
    give_keys(alice, ssh_env)
    give_keys(bob, ssh_env, trust=False)
    work = remote_workdir(team_dir)
    home = team_home(team_dir)
    service = start(services, home, "--tcp-port", "0")
    # bob's known_hosts names another key for the host: never accepted.
    done = as_user(bob, home, "submit", "--wait", "--timeout", "60", str(jobfile(team_dir, bob, ssh_env, work)))
    shown = json.loads(cli_ok(home, "jobs", "--json"))["jobs"]
    reason = shown[0]["reason"] if shown else done.stderr
    assert "host key" in reason and "not trusted" in reason, (done, reason)

    # alice's job names bob's key, which the (root) service could read, and alice cannot: her run is refused,
    # naming the file and alice. (Her own command line would not send it; a client over TCP might.)
    token = cli_ok(home, "token", alice).strip()
    bobs_key = Path(pwd.getpwnam(bob).pw_dir) / ".ssh" / "id_ed25519"
    settings = {"hosts": [f"{alice}@127.0.0.1:{ssh_env.sshds[0].port}"], "key": str(bobs_key),
                "known_hosts": str(Path(pwd.getpwnam(alice).pw_dir) / ".ssh" / "known_hosts"), "workdir": str(work)}
    spec = Job(name="stolen", application=Executable("/usr/bin/id", args=["-u"]),
               backend=Backend("ssh", **settings)).spec()
    with httpx.Client(base_url=service.url, headers={"authorization": f"Bearer {token}"}, timeout=60) as http:
        fqid = http.post("/api/add", json={"name": "stolen", "spec": spec}).json()["fqid"]
        answer = http.post("/api/submit", json={"fqid": fqid})
    assert answer.status_code == 409, answer.text  # its one run could not be submitted: it stays new
    assert f"{bobs_key} cannot be read by {alice}" in answer.json()["message"], answer.json()
    assert json.loads(cli_ok(home, "show", fqid, "--json"))["status"] == "new"
