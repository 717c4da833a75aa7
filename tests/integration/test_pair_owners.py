"""Failover torture with two users (issue 22): the active/standby pair on PostgreSQL, as root under real
supervisord, admits orch-alice and orch-bob; each submits, through the command line as themselves, a job on
``ssh`` (two loopback sshds) and one on ``local``; the active service is SIGKILLed 3 times while they run. At the
end every subjob completed exactly once, and each ssh run ran as its owner (the uid it wrote on the host).

A sibling of ``test_pair_torture.py`` (which keeps its 700 subjobs of the service's own user), kept small.
"""

from __future__ import annotations

import json
import os
import pwd
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from pair import Following, Pair, pair_homes
from sshd import SshEnv, allow_login
from test_service_owners import _user, as_user
from test_ssh_owners import give_keys

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

OWNERS = ("orch-alice", "orch-bob")
N = 16
KILLS = 3
#: DESIGN: on the leader's death the standby takes over within this many seconds.
TAKEOVER_LIMIT = 10.0


@pytest.fixture
def open_root() -> Iterator[Path]:
    """Homes, shared dir and the hosts' dirs, in a directory every user may traverse."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser: the clients and the runs are other OS users")
    for name in OWNERS:
        _user(name)
        allow_login(name)
    path = Path(tempfile.mkdtemp(prefix="orch-pair-owners-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pair(pg_url: str, open_root: Path) -> Iterator[Pair]:
    a, b, shared = pair_homes(open_root, pg_url, core="poll_interval = 0.25")
    for home in (a, b):
        with open(home / "orchestrator.toml", "a") as f:
            f.write(f"[service]\nusers = {json.dumps(list(OWNERS))}\n")
    both = Pair(a, b)
    both.start()
    yield both
    both.stop()


def jobfiles(where: Path, user: str, env: SshEnv, work: Path, side: Path) -> list[Path]:
    """``user``'s two jobs: N subjobs on ssh and N on local, each sleeping a little, then writing its uid to
    ``side/BACKEND-USER-i``."""
    hosts = json.dumps([f"127.0.0.1:{sshd.port}" for sshd in env.sshds])
    script = 'sleep "$1"; id -u >> "$2/$0"'
    out = []
    for backend in ("ssh", "local"):
        rng = random.Random(f"{user}-{backend}")
        args = [["-c", script, f"{backend}-{user}-{i}", f"{rng.uniform(0.5, 3.0):.2f}", str(side)] for i in range(N)]
        table = (f'name = "ssh"\nhosts = {hosts}\nkey = "~/.ssh/id_ed25519"\nworkdir = "{work}"\nslots = 4\n'
                 if backend == "ssh" else 'name = "local"\n')
        path = where / f"{user}-{backend}.toml"
        path.write_text(f'name = "{user}-{backend}"\n[application]\nexe = "/bin/sh"\n[backend]\n{table}'
                        f'[splitter]\ntype = "args"\nargs = {json.dumps(args)}\n')
        path.chmod(0o644)
        out.append(path)
    return out


async def test_two_users_jobs_survive_sigkills_of_the_active_root_service(pair: Pair, ssh_env2: SshEnv,
                                                                         open_root: Path) -> None:
    for user in OWNERS:
        give_keys(user, ssh_env2)
    work, side = open_root / "remote", open_root / "side"
    for d in (work, side):
        d.mkdir()
        d.chmod(0o1777)
    home = pair.sups[1].home
    await pair.active()
    fqids: dict[str, str] = {}
    for user in OWNERS:  # through the command line, as each user, on whichever home: it finds the active one
        for path in jobfiles(open_root, user, ssh_env2, work, side):
            done = await anyio.to_thread.run_sync(as_user, user, home, "submit", str(path))
            assert done.returncode == 0, (user, path.name, done.stderr)
            fqids[path.stem] = done.stdout.split()[0]
    rng = random.Random(22)
    await pair.kill_at_random(KILLS, 1.0, 2.5, rng)
    assert len(pair.takeovers) == KILLS and max(pair.takeovers) < TAKEOVER_LIMIT, pair.takeovers

    api = Following(home, deadline=time.monotonic() + 180)
    masters = await api.wait_final(list(fqids.values()))
    assert [m["status"] for m in masters] == ["completed"] * len(fqids), masters
    assert {m["fqid"]: m["owner"] for m in masters} == {f: name.rsplit("-", 1)[0] for name, f in fqids.items()}
    for user in OWNERS:
        uid = str(pwd.getpwnam(user).pw_uid)
        for backend in ("ssh", "local"):
            lines = {i: (side / f"{backend}-{user}-{i}").read_text().split() for i in range(N)
                     if (side / f"{backend}-{user}-{i}").exists()}
            assert {i: len(v) for i, v in lines.items() if len(v) != 1} == {} and len(lines) == N, (backend, user)
            if backend == "ssh":  # each ran once, as its owner, on the host
                assert {v[0] for v in lines.values()} == {uid}, (user, lines)
