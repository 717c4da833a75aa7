"""``orchestrator serve`` as a real process: who may talk to it. TCP only with the token (and a token file
that is refused when it is unsafe), the Unix socket only for its owner (file modes and ``SO_PEERCRED``).

Each service is a subprocess of the installed ``orchestrator`` command, stopped by its PID at teardown.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from served import ORCH, TOKEN, Service, start

from orchestrator.api.client import ServiceClient
from orchestrator.core.errors import OrchestratorError


# ------------------------------------------------------------------ (a) TCP and its token
def test_tcp_answers_only_the_right_bearer_token(shared: Service) -> None:
    port = shared.info["tcp_port"]
    assert isinstance(port, int) and port > 0 and shared.info["host"] == "127.0.0.1"
    routes: list[tuple[str, str, Any]] = [("GET", "/health", None), ("POST", "/api/jobs", {}),
                                          ("GET", "/api/jobs", None), ("GET", "/api/events", None), ("GET", "/", None)]
    refused = [{}, {"authorization": "Bearer wrong-token-of-some-length"}, {"authorization": f"Bearer {TOKEN[:-1]}"},
               {"authorization": f"Bearer {TOKEN}x"}, {"authorization": f"Basic {TOKEN}"},
               {"authorization": "Bearer"}, {"cookie": "orch_token=wrong-token-of-some-length"}]
    for headers in refused:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=15.0) as c:
            for method, path, body in routes:
                r = c.request(method, path, json=body)
                assert r.status_code == 401, (headers, method, path, r.status_code, r.text)
                assert r.json()["error"] == "unauthorized"
                assert r.headers["www-authenticate"].startswith("Bearer")
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"authorization": f"Bearer {TOKEN}"},
                      timeout=15.0) as c:
        health = c.get("/health")
        assert health.status_code == 200 and health.json()["ok"] is True and health.json()["pid"] == shared.pid
        assert c.post("/api/jobs", json={}).status_code == 200
        assert isinstance(c.get("/api/jobs").json(), list)
        with c.stream("GET", "/api/events") as events:
            assert events.status_code == 200
            assert events.headers["content-type"].startswith("text/event-stream")
            assert next(events.iter_lines()).startswith(": events follow")


def test_tcp_browser_login_sets_the_token_cookie(shared: Service) -> None:
    base = f"http://127.0.0.1:{shared.info['tcp_port']}"
    with httpx.Client(base_url=base, timeout=15.0) as c:
        assert c.get("/", params={"token": "wrong-token-of-some-length"}).status_code == 401
        login = c.get("/", params={"token": TOKEN})
        assert login.status_code == 303 and login.headers["location"].startswith("/#csrf=")
        assert "HttpOnly" in login.headers["set-cookie"] and TOKEN not in login.headers["set-cookie"]
        csrf = login.headers["location"].removeprefix("/#csrf=")
        # the cookie, kept by the client, with the session's CSRF token, now lets it in
        assert c.get("/health", headers={"x-csrf-token": csrf}).status_code == 200
        assert c.get("/health").status_code == 401


def test_service_client_over_tcp(shared: Service) -> None:
    url = f"http://127.0.0.1:{shared.info['tcp_port']}"

    async def main() -> None:
        async with ServiceClient(url=url, token=TOKEN) as client:
            assert (await client.health())["pid"] == shared.pid
        async with ServiceClient(url=url, token="wrong-token-of-some-length") as client:
            with pytest.raises(OrchestratorError, match="401"):
                await client.jobs()

    anyio.run(main)


def test_a_token_file_shorter_than_16_characters_is_refused(tmp_path: Path) -> None:
    token_file = tmp_path / "short-token"
    token_file.write_text("x" * 15 + "\n")
    token_file.chmod(0o600)
    home = tmp_path / "home"
    result = subprocess.run([str(ORCH), "--home", str(home), "serve", "--tcp-port", "0", "--token-file",
                             str(token_file)], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode != 0
    assert "at least 16 characters" in result.stderr and str(token_file) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (home / "service" / "api.sock").exists() and not (home / "service" / "service.json").exists()


@pytest.mark.parametrize("case", ["readable", "without-tcp", "port-in-use"])
def test_token_file_and_port_mistakes_are_refused_clearly(case: str, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("t" * 32 + "\n")
    token_file.chmod(0o644 if case == "readable" else 0o600)
    args = ["--token-file", str(token_file)]
    expected = {"readable": "others may read it", "without-tcp": "give --tcp-port"}
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        if case != "without-tcp":
            args += ["--tcp-port", str(busy.getsockname()[1] if case == "port-in-use" else 0)]
        expected["port-in-use"] = f"cannot listen on 127.0.0.1:{busy.getsockname()[1]}"
        result = subprocess.run([str(ORCH), "--home", str(tmp_path / "home"), "serve", *args], capture_output=True,
                                text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and expected[case] in result.stderr and "Traceback" not in result.stderr, result


# ------------------------------------------------------------------ (b) the Unix socket: owner only
def _as_user(uid: int, gid: int, path: Path) -> str:
    """In a child process running as ``uid``: GET /health on the socket; the status line, or the error's name."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(10)
                    s.connect(str(path))
                    s.sendall(b"GET /health HTTP/1.1\r\nhost: orchestrator\r\nconnection: close\r\n\r\n")
                    data = b""
                    while chunk := s.recv(65536):
                        data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                answer = head.split(b"\r\n")[0].decode() + " " + body.decode(errors="replace")
            except OSError as exc:
                answer = type(exc).__name__
            os.write(write_end, answer.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        answer = f.read().decode()
    os.waitpid(pid, 0)
    return answer


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory other users may traverse (pytest's tmp_path is 0700), so only the service's own modes count."""
    path = Path(tempfile.mkdtemp(prefix="orch-svc-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_unix_socket_refuses_other_users(services: list[Service], open_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: a client must run as another user")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")
    home = open_dir / "home"
    service = start(services, home)
    home.chmod(0o755)
    sock_dir = home / "service"
    assert stat.S_IMODE(sock_dir.stat().st_mode) == 0o700
    st = service.socket.stat()
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()

    # The modes alone keep another user out: the directory, then the socket itself.
    assert _as_user(nobody.pw_uid, nobody.pw_gid, service.socket) == "PermissionError"
    sock_dir.chmod(0o777)
    assert _as_user(nobody.pw_uid, nobody.pw_gid, service.socket) == "PermissionError"
    # With both wide open, SO_PEERCRED still does.
    service.socket.chmod(0o777)
    answer = _as_user(nobody.pw_uid, nobody.pw_gid, service.socket)
    assert answer.startswith("HTTP/1.1 403"), answer
    assert json.loads(answer.split(" ", 3)[3])["error"] == "forbidden"
    with service.client() as c:  # the owner still gets in
        assert c.get("/health").status_code == 200


