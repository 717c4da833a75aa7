"""Owners through a real service (``orchestrator serve`` subprocesses, stopped by PID): two users' jobs are
invisible to each other and refused with a message naming the owner; an admin sees and acts on both.

Over TCP, each user shows a token of their own (``orchestrator token USER``). Every user a service names is an
OS user (``orch-alice``, ``orch-bob``, the admin ``daemon``), and a multi-user service runs as root: these tests
run as root. On the Unix socket, the OS users (``nobody``, ``daemon``) run the command line themselves.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import shutil
import sqlite3
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from served import Service, cli, cli_ok, start

from orchestrator import Backend, Executable, Job, NotOwnerError, Orchestrator, RetryPolicy, StepSplitter
from orchestrator.api.client import ServiceClient
from orchestrator.core import codec
from orchestrator.core.errors import OrchestratorError

TEAM_TOML = '[core]\npoll_interval = 0.05\n[service]\nusers = ["orch-alice", "orch-bob"]\nadmins = ["daemon"]\n'


def sim_spec(name: str, seconds: float = 0.1) -> dict[str, Any]:
    job = Job(name=name, application=Executable("/bin/true"), backend=Backend("sim", run_seconds=seconds),
              retry=RetryPolicy(max_early=0, max_late_handled=0, max_late_unhandled=0))
    return job.spec()


def _multi_user_service() -> None:
    """A service that names other users runs as root, and they are OS users."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a multi-user service runs as root")
    for name in ("orch-alice", "orch-bob", "daemon"):
        _user(name)


@pytest.fixture
def team(services: list[Service], tmp_path: Path) -> tuple[Service, dict[str, str]]:
    """A service on TCP whose settings name users orch-alice and orch-bob and admin daemon; each one's token."""
    _multi_user_service()
    home = tmp_path / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text(TEAM_TOML)
    service = start(services, home, "--tcp-port", "0")
    tokens = {user: cli_ok(home, "token", user).strip() for user in ("orch-alice", "orch-bob", "daemon")}
    return service, tokens


def client(service: Service, token: str) -> ServiceClient:
    return ServiceClient(url=service.url, token=token)


def test_two_users_over_tcp_see_their_own_jobs_and_are_refused_the_others(team: tuple[Service, dict[str, str]]
                                                                         ) -> None:
    service, tokens = team
    store = service.home / "service" / "tokens"
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    assert not any(t in store.read_text() for t in tokens.values())  # kept hashed only

    async def main() -> None:
        async with client(service, tokens["orch-alice"]) as alice, client(service, tokens["orch-bob"]) as bob, \
                client(service, tokens["daemon"]) as carol, client(service, service.token) as owner:
            a = await alice.add(name="orch-alice-job", spec=sim_spec("orch-alice-job"))
            b = await bob.add(name="orch-bob-job", spec=sim_spec("orch-bob-job"))
            assert (a["owner"], b["owner"]) == ("orch-alice", "orch-bob")
            a_id, b_id = a["fqid"], b["fqid"]

            # Invisible to each other; the admins (carol, and the service's own user) see both.
            assert [j["fqid"] for j in await alice.jobs()] == [a_id]
            assert [j["fqid"] for j in await bob.jobs()] == [b_id]
            for admin in (carol, owner):
                assert {j["fqid"]: j["owner"] for j in await admin.jobs()} == {a_id: "orch-alice", b_id: "orch-bob"}
            assert [j["fqid"] for j in await carol.jobs(owner="orch-bob")] == [b_id]
            assert [r["id"] for r in (await bob.describe())["jobs"]] == [int(b_id)]
            assert (await bob.health())["jobs"] == 1

            # Every look-up and operation on alice's job, by bob: refused, naming alice.
            calls: list[tuple[str, dict[str, Any]]] = [
                ("show", {"fqid": a_id}), ("info", {"fqid": a_id}), ("master", {"fqid": a_id}),
                ("peek", {"fqid": a_id}), ("states", {"fqid": a_id}), ("story", {"fqid": a_id}),
                ("infos", {"fqids": [a_id]}),
                ("submit", {"fqid": a_id}), ("kill", {"fqid": a_id}), ("resubmit", {"fqid": a_id}),
                ("release", {"fqid": a_id}), ("force_status", {"fqid": a_id, "status": "failed"}),
                ("remove", {"fqid": a_id}), ("wait", {"fqid": a_id, "timeout": 1}),
                ("annotate", {"job": int(a_id), "comment": "mine now"}), ("backend_id", {"fqid": a_id}),
                ("submit", {"targets": [b_id, a_id]}),
            ]
            for method, kwargs in calls:
                with pytest.raises(NotOwnerError) as refused:
                    await bob.call(method, **kwargs)
                assert str(refused.value) == f"job {a_id} belongs to orch-alice; you are orch-bob", method
                assert (refused.value.owner, refused.value.user) == ("orch-alice", "orch-bob")
            assert (await bob.describe(jobs=[int(a_id)]))["jobs"] == []
            assert (await bob.owner(job=int(a_id)))["owner"] == "orch-alice"

            # Refused means untouched: alice's job is still new, her comment unchanged; bob's own work goes on.
            shown = await alice.show(fqid=a_id)
            assert shown["status"] == "new" and shown["comment"] == ""
            assert (await bob.submit(fqid=b_id))["acted"] == 1

            # An admin acts on anyone's job; what it adds is its own.
            assert (await carol.submit(fqid=a_id))["acted"] == 1
            assert not (await carol.wait(fqid=a_id, timeout=30))["timed_out"]
            assert (await alice.show(fqid=a_id))["status"] == "completed"
            c = await carol.add(name="daemon-job", spec=sim_spec("daemon-job"))
            assert c["owner"] == "daemon" and c["fqid"] not in {j["fqid"] for j in await alice.jobs()}

            # As the HTTP API says it: 403 "not owner", with the owner and the user.
            async with httpx.AsyncClient(base_url=service.url, timeout=10,
                                         headers={"authorization": f"Bearer {tokens['orch-bob']}"}) as raw:
                answer = await raw.get("/api/show", params={"fqid": a_id})
                assert answer.status_code == 403
                assert answer.json() | {"message": None} == {"error": "not owner", "message": None, "fqid": a_id,
                                                              "field": None, "owner": "orch-alice", "user": "orch-bob"}
                assert (await raw.get(f"/peek/{a_id}/stdout")).status_code == 403

            # A pre-job, added by the service when alice's partitioned job starts, is alice's too.
            part = Job(name="part", application=Executable("/bin/true"), backend=Backend("sim", run_seconds=0.05),
                       steps="1..4", splitter=StepSplitter(2),
                       prejob=Job(application=Executable("/bin/true"), backend=Backend("sim", run_seconds=0.05)))
            p_id = (await alice.add(name="part", spec=part.spec()))["fqid"]
            await alice.submit(fqid=p_id)
            await alice.wait(fqid=p_id, timeout=30)
            hers = {j["name"]: j["owner"] for j in await alice.jobs()}
            assert hers == {"orch-alice-job": "orch-alice", "part": "orch-alice", "part-prejob": "orch-alice"}
            assert {j["name"] for j in await bob.jobs()} == {"orch-bob-job"}

    anyio.run(main)


def test_a_users_event_stream_carries_only_their_jobs(team: tuple[Service, dict[str, str]]) -> None:
    service, tokens = team

    async def follow(token: str, until_job: str, seen: list[set[str]], opened: anyio.Event) -> None:
        async with client(service, token) as c:
            async for item in c.events(opened):
                if "type" not in item:
                    continue
                event = codec.decode(item)
                seen.append({str(fq[0]) for fq in event.ids})
                if item["type"] == "StatusChanged" and item["new"] == "completed" and str(until_job) in seen[-1]:
                    return

    async def main() -> None:
        async with client(service, tokens["orch-alice"]) as alice, client(service, tokens["orch-bob"]) as bob:
            a = (await alice.add(name="a", spec=sim_spec("a", 0.05)))["fqid"]
            b = (await bob.add(name="b", spec=sim_spec("b", 1.0)))["fqid"]
            bob_seen: list[set[str]] = []
            carol_seen: list[set[str]] = []
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    opened = [anyio.Event(), anyio.Event()]
                    tg.start_soon(follow, tokens["orch-bob"], b, bob_seen, opened[0])
                    tg.start_soon(follow, tokens["daemon"], b, carol_seen, opened[1])
                    for o in opened:
                        await o.wait()
                    await alice.submit(fqid=a)
                    await bob.submit(fqid=b)
            # bob's stream went on until his job completed (alice's completed meanwhile), and never named hers;
            # the admin's, over the same time, carried both.
            assert any(b in ids for ids in bob_seen) and not any(a in ids for ids in bob_seen), bob_seen
            assert any(a in ids for ids in carol_seen) and any(b in ids for ids in carol_seen)

    anyio.run(main)


def test_tokens_are_given_to_named_users_only_and_can_be_revoked(team: tuple[Service, dict[str, str]]) -> None:
    service, tokens = team
    refused = cli(service.home, "token", "mallory")
    assert refused.returncode == 2 and "mallory is not named by [service] users or admins" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert cli_ok(service.home, "token", "--list").split() == ["daemon", "orch-alice", "orch-bob"]
    again = cli_ok(service.home, "token", "orch-bob").strip()  # a new token replaces bob's old one
    assert cli_ok(service.home, "token", "--revoke", "orch-alice").strip() == "user orch-alice: token revoked"

    async def main() -> None:
        for token, works in ((tokens["orch-alice"], False), (tokens["orch-bob"], False), (again, True),
                             (tokens["daemon"], True), (service.token, True)):
            async with client(service, token) as c:
                if works:
                    await c.jobs()
                else:
                    with pytest.raises(OrchestratorError, match="401"):
                        await c.jobs()

    anyio.run(main)


def test_owners_survive_a_restart_and_old_jobs_belong_to_the_homes_owner(services: list[Service],
                                                                         tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    me = pwd.getpwuid(os.getuid()).pw_name

    async def embedded() -> None:
        async with Orchestrator(home=home) as orch:  # the embedded API: the current user owns what it adds
            assert orch.user == me
            job = await orch.jobs.add(Job(name="mine", application=Executable("/bin/true"), backend="sim"))
            assert job.owner == me
            twin = await job.copy()
            assert twin.owner == me and (await orch.jobs.add(job.template())).owner == me
        async with Orchestrator(home=home) as orch:
            assert [j.owner for j in orch.jobs] == [me, me, me]
            assert [j.fqid for j in orch.jobs.select(owner=me)] == ["0", "1", "2"]
            assert len(orch.jobs.select(owner="orch-alice")) == 0

    anyio.run(embedded)
    # A job stored before owners existed: its definition has no owner (as an older version wrote it).
    with sqlite3.connect(home / "repository.sqlite") as db:
        db.execute("UPDATE jobs SET spec = json_remove(spec, '$.owner') WHERE id = 2")
    (home / "orchestrator.toml").write_text(TEAM_TOML)
    _multi_user_service()
    service = start(services, home, "--tcp-port", "0")
    alice_token = cli_ok(home, "token", "orch-alice").strip()

    async def through_service(expect_alice: bool) -> None:
        async with client(service, alice_token) as alice, client(service, service.token) as owner:
            if not expect_alice:
                assert (await alice.add(name="hers", spec=sim_spec("hers")))["fqid"] == "3"
            assert [j["fqid"] for j in await alice.jobs()] == ["3"]
            listed = {j["fqid"]: j["owner"] for j in await owner.jobs()}
            assert listed == {"0": me, "1": me, "2": me, "3": "orch-alice"}  # the old job: the home's owner's
            with pytest.raises(NotOwnerError, match=f"job 2 belongs to {me}; you are orch-alice"):
                await alice.kill(fqid="2")

    anyio.run(through_service, False)
    service.terminate()
    service = start(services, home, "--tcp-port", "0")
    anyio.run(through_service, True)
    assert "belongs to" not in service.output()
    assert alice_token not in service.output()  # tokens are never logged

    # Dropped from the settings: alice's token no longer lets her in.
    service.terminate()
    (home / "orchestrator.toml").write_text(TEAM_TOML.replace('"orch-alice", ', ""))
    service = start(services, home, "--tcp-port", "0")

    async def dropped() -> None:
        async with client(service, alice_token) as alice:
            with pytest.raises(OrchestratorError, match="401"):
                await alice.jobs()

    anyio.run(dropped)


# ------------------------------------------------------------------ the Unix socket, real OS users (root only)
def _user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pytest.skip(f"no OS user {name!r} on this machine")


@functools.cache
def _python_for(user: str) -> list[str]:
    """A command that runs this checkout's ``orchestrator`` as ``user`` (this interpreter, or the system's
    python of the same version when this one lives where ``user`` may not go, e.g. under /root)."""
    site = sysconfig.get_paths()["purelib"]
    boot = (f"import site, sys; site.addsitedir({site!r}); sys.argv[0] = 'orchestrator'; "
            "from orchestrator.cli.commands import cli; cli()")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for python in (sys.executable, shutil.which(version) or "", f"/usr/bin/{version}"):
        if python and subprocess.run(["runuser", "-u", user, "--", python, "-S", "-c", "pass"],
                                     capture_output=True, timeout=30).returncode == 0:
            return [python, "-S", "-c", boot]
    pytest.skip(f"no python {version} that user {user!r} may run")


def as_user(user: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", user, "--", *_python_for(user), "--home", str(home), *args],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, cwd=home.parent)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory other users may traverse (pytest's tmp_path is 0700), so only the service's own modes count."""
    path = Path(tempfile.mkdtemp(prefix="orch-owners-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_two_os_users_on_the_unix_socket(services: list[Service], open_dir: Path) -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser: the clients must run as other OS users")
    for name in ("nobody", "daemon", "bin"):
        _user(name)
    home = open_dir / "home"
    home.mkdir()
    home.chmod(0o755)
    (home / "orchestrator.toml").write_text('[core]\npoll_interval = 0.05\n[service]\nusers = ["nobody", "daemon"]\n')
    jobfile = open_dir / "job.toml"
    jobfile.write_text('name = "scan"\n[application]\nexe = "/bin/true"\n[backend]\nname = "sim"\n')
    jobfile.chmod(0o644)
    service = start(services, home)
    # Open to the users the settings name: the socket to everyone, its directory to be crossed, not listed.
    assert stat.S_IMODE((home / "service").stat().st_mode) == 0o711
    assert stat.S_IMODE(service.socket.stat().st_mode) == 0o666

    def ok(user: str, *args: str) -> str:
        done = as_user(user, home, *args)
        assert done.returncode == 0, (user, args, done.stderr)
        return done.stdout

    mine = ok("nobody", "submit", str(jobfile)).strip()
    theirs = ok("daemon", "submit", str(jobfile)).strip()
    listing = json.loads(ok("daemon", "jobs", "--json"))
    assert [(j["fqid"], j["owner"]) for j in listing["jobs"]] == [(theirs, "daemon")]
    assert "daemon" in ok("daemon", "jobs") and "nobody" not in ok("daemon", "jobs")
    for command in (["show", mine], ["kill", mine], ["peek", mine], ["remove", mine], ["wait", mine]):
        refused = as_user("daemon", home, *command)
        assert refused.returncode == 2, (command, refused)
        assert refused.stderr.strip() == f"error: job {mine} belongs to nobody; you are daemon", refused.stderr
    # The service's own user (an admin) sees both, and who owns which.
    everyone = json.loads(cli_ok(home, "jobs", "--json"))
    assert {j["fqid"]: j["owner"] for j in everyone["jobs"]} == {mine: "nobody", theirs: "daemon"}
    narrowed = json.loads(cli_ok(home, "jobs", "--owner", "nobody", "--json"))
    assert [j["fqid"] for j in narrowed["jobs"]] == [mine]
    assert ["owner", "nobody"] in [line.split() for line in ok("nobody", "show", mine).splitlines()]
    # Anyone else is turned away, though the socket's modes let them reach it.
    outsider = as_user("bin", home, "jobs")
    assert outsider.returncode == 2 and "403" in outsider.stderr
    assert "user bin" in outsider.stderr and "may not use this service" in outsider.stderr
    assert "Traceback" not in outsider.stderr


def test_without_users_the_socket_stays_the_owners_alone(services: list[Service], open_dir: Path) -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser: the client must run as another OS user")
    _user("nobody")
    home = open_dir / "home"
    service = start(services, home)
    home.chmod(0o755)
    assert stat.S_IMODE((home / "service").stat().st_mode) == 0o700
    assert stat.S_IMODE(service.socket.stat().st_mode) == 0o600
    refused = as_user("nobody", home, "jobs")
    assert refused.returncode == 2 and "may not use" in refused.stderr and "Traceback" not in refused.stderr
