"""Revocation at once (issue 22, item 9), on real ``orchestrator serve`` processes: an event stream of a token
revoked with ``orchestrator token --revoke USER`` closes within a second, a browser session opened with that token
too; a user removed from ``[service] users`` and a SIGHUP: refused at once, over TCP and on the Unix socket (a
real OS user), and their streams closed.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from served import Service, cli_ok, start

pytestmark = pytest.mark.anyio

#: The issue's bound: seconds from the revocation to the stream's end.
CLOSED_WITHIN = 1.0


class Stream:
    """One ``GET /api/events`` over TCP, followed in a task: ``ended`` is the monotonic time it closed."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.url, self.headers = url, headers
        self.open = anyio.Event()
        self.closed = anyio.Event()
        self.lines: list[str] = []
        self.ended = 0.0

    async def follow(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(10, read=None)) as client, \
                client.stream("GET", "/api/events", headers=self.headers) as answer:
            assert answer.status_code == 200, await answer.aread()
            self.open.set()
            async for line in answer.aiter_lines():
                self.lines.append(line)
        self.ended = time.monotonic()
        self.closed.set()


async def _closed_in_time(streams: list[Stream], since: float) -> None:
    with anyio.fail_after(10):
        for stream in streams:
            await stream.closed.wait()
    for stream in streams:
        assert stream.ended - since < CLOSED_WITHIN, (stream.ended - since, stream.lines)
        assert "event: revoked" in stream.lines


async def test_revoking_a_token_closes_its_streams_at_once(tmp_path: Path, services: list[Service]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    try:  # a multi-user service admits OS users only (it runs their work as them)
        users = [pwd.getpwnam(name).pw_name for name in ("orch-alice", "orch-bob")]
    except KeyError:
        pytest.skip("no OS users orch-alice and orch-bob (scripts/install-test-deps.sh makes them)")
    (home / "orchestrator.toml").write_text(f'[service]\nusers = ["{users[0]}", "{users[1]}"]\n')
    service = start(services, home, "--tcp-port", "0")
    alice, bob = (cli_ok(home, "token", user).strip() for user in users)
    # A browser session of alice's, opened with her token: its cookie and CSRF token.
    async with httpx.AsyncClient(base_url=service.url, timeout=10) as browser:
        login = await browser.get("/", params={"token": alice})
        assert login.status_code == 303
        session = {"cookie": login.headers["set-cookie"].split(";")[0],
                   "x-csrf-token": login.headers["location"].removeprefix("/#csrf=")}
    by_token = Stream(service.url, {"authorization": f"Bearer {alice}"})
    by_session = Stream(service.url, session)
    others = Stream(service.url, {"authorization": f"Bearer {bob}"})
    async with anyio.create_task_group() as tg:
        for stream in (by_token, by_session, others):
            tg.start_soon(stream.follow)
        with anyio.fail_after(10):
            for stream in (by_token, by_session, others):
                await stream.open.wait()
        await service.cli("token", "--revoke", users[0])  # the file is written before the command returns
        revoked = time.monotonic()
        await _closed_in_time([by_token, by_session], revoked)
        assert not others.closed.is_set()  # bob's stream goes on
        async with httpx.AsyncClient(base_url=service.url, timeout=10) as client:
            assert (await client.get("/api/jobs", headers={"authorization": f"Bearer {alice}"})).status_code == 401
            assert (await client.get("/api/jobs", headers=session)).status_code == 401
            assert (await client.get("/api/jobs", headers={"authorization": f"Bearer {bob}"})).status_code == 200
        tg.cancel_scope.cancel()


async def _line(stream: Any) -> str:
    data = b""
    while not data.endswith(b"\n"):
        data += await stream.receive(1)
    return data.decode().strip()


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory other users may traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="orch-revoke-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


#: Run as an OS user: follow the event stream on the Unix socket; "open" once it answers, "closed" at its end.
FOLLOWER = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"GET /api/events HTTP/1.1\\r\\nhost: orchestrator\\r\\n\\r\\n")
first = s.recv(65536)
if not first.startswith(b"HTTP/1.1 200"):
    sys.exit(print("refused " + first[:40].decode(), flush=True))
print("open", flush=True)
seen = first
while not seen.endswith(b"\\r\\n0\\r\\n\\r\\n"):  # the chunked body's end (or the connection's)
    part = s.recv(65536)
    if not part:
        break
    seen = seen[-16:] + part
print("closed", flush=True)
"""


async def test_a_user_removed_from_the_settings_is_refused_after_sighup(services: list[Service],
                                                                         open_dir: Path) -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser: a client runs as another OS user")
    try:
        alice = pwd.getpwnam("orch-alice").pw_name
        bob = pwd.getpwnam("orch-bob").pw_name
    except KeyError:
        pytest.skip("no OS users orch-alice and orch-bob (scripts/install-test-deps.sh makes them)")
    home = open_dir / "home"
    home.mkdir()
    home.chmod(0o755)
    settings = home / "orchestrator.toml"
    settings.write_text(f'[service]\nusers = ["{alice}", "{bob}"]\n')
    service = start(services, home, "--tcp-port", "0")
    token = cli_ok(home, "token", alice).strip()
    follower = await anyio.open_process(["runuser", "-u", alice, "--", "/usr/bin/python3", "-S", "-c", FOLLOWER,
                                         str(service.socket)], stdin=subprocess.DEVNULL)
    assert follower.stdout is not None
    try:
        with anyio.fail_after(15):
            assert (await _line(follower.stdout)) == "open"
        over_tcp = Stream(service.url, {"authorization": f"Bearer {token}"})
        async with anyio.create_task_group() as tg:
            tg.start_soon(over_tcp.follow)
            with anyio.fail_after(10):
                await over_tcp.open.wait()
            settings.write_text(f'[service]\nusers = ["{bob}"]\n')
            os.kill(service.pid, signal.SIGHUP)
            sent = time.monotonic()
            await _closed_in_time([over_tcp], sent)
            with anyio.fail_after(10):
                assert (await _line(follower.stdout)) == "closed"
            assert time.monotonic() - sent < CLOSED_WITHIN + 0.5  # (the follower's line took its own time)
        # The service lives on and answers: alice refused on both transports, the rest as before.
        assert service.proc_().poll() is None
        with service.client() as owner:
            assert owner.get("/health").status_code == 200
        async with httpx.AsyncClient(base_url=service.url, timeout=10) as client:
            assert (await client.get("/api/jobs", headers={"authorization": f"Bearer {token}"})).status_code == 401
        refused = subprocess.run(["runuser", "-u", alice, "--", "/usr/bin/python3", "-S", "-c", FOLLOWER,
                                  str(service.socket)], capture_output=True, text=True, timeout=30)
        assert refused.stdout.startswith("refused HTTP/1.1 403"), refused
    finally:
        if follower.returncode is None:
            follower.kill()
        await follower.wait()
