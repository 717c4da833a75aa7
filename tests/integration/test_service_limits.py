"""The control API's limits and answers: a body over ``max_request_bytes`` refused before it is read, a 409 that
names its job, and the status page's address said when the service starts."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest
from served import Service

from orchestrator import Executable, Job, Orchestrator


def raw_exchange(path: Path, head: bytes, timeout: float = 10.0) -> bytes:
    """Send only a request's head on the Unix socket and read the answer until the server closes."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        s.sendall(head)
        answer = b""
        while True:
            try:
                part = s.recv(65536)
            except TimeoutError:
                break
            if not part:
                break
            answer += part
    return answer


def test_a_body_over_the_limit_is_refused_before_it_is_read(tmp_path: Path, services: list[Service]) -> None:
    service = Service(tmp_path / "home")
    services.append(service.start())
    head = (b"POST /api/jobs HTTP/1.1\r\nHost: orchestrator\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (17 * 1024 * 1024))
    started = time.monotonic()
    answer = raw_exchange(service.socket, head)  # not one byte of the 17 MiB is sent
    assert time.monotonic() - started < 5
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 413"), answer[:200]
    body = json.loads(rest.split(b"\r\n\r\n", 1)[1])
    assert "over the limit of 16777216" in body["message"] and "max_request_bytes" in body["message"]
    # The service serves on.
    with service.client() as client:
        assert client.post("/api/jobs", json={}).status_code == 200


def test_the_limit_is_a_setting(tmp_path: Path, services: list[Service]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text("[service]\nmax_request_bytes = 2048\n")
    service = Service(home)
    services.append(service.start())
    with service.client() as client:
        small = client.post("/api/jobs", json={})
        big = client.post("/api/jobs", content=b"{" + b" " * 4000 + b"}", headers={"content-type": "application/json"})
    assert small.status_code == 200
    assert big.status_code == 413 and "over the limit of 2048" in big.json()["message"]


@pytest.mark.anyio
async def test_a_refusal_names_its_job(tmp_path: Path, services: list[Service]) -> None:
    service = Service(tmp_path / "home")
    services.append(service.start())
    async with Orchestrator(home=service.home) as orch:  # through the service
        j = await orch.jobs.add(Job(name="x", application=Executable("/bin/true"), backend="sim"))
    with service.client() as client:
        refused = client.post("/api/kill", json={"fqid": j.fqid})
        by_target = client.post("/api/kill", json={"targets": [j.fqid]})
    for answer in (refused, by_target):
        assert answer.status_code == 409, answer.text
        assert answer.json()["fqid"] == j.fqid and answer.json()["error"] == "refused"


def test_the_status_page_address_is_said_at_start(tmp_path: Path, services: list[Service]) -> None:
    with_tcp = Service(tmp_path / "a", "--tcp-port", "0")
    services.append(with_tcp.start())
    without = Service(tmp_path / "b")
    services.append(without.start())
    ready = [json.loads(line) for line in with_tcp.out.read_text().splitlines()
             if line.startswith("{") and '"service ready"' in line]
    assert ready[0]["status_page"] == (f"http://127.0.0.1:{with_tcp.port}/?token=$(cat "
                                       f"{with_tcp.home / 'service' / 'token'})")
    assert httpx.get(f"http://127.0.0.1:{with_tcp.port}/?token={with_tcp.token}").status_code in (200, 303)
    off = [json.loads(line) for line in without.out.read_text().splitlines()
           if line.startswith("{") and '"service ready"' in line]
    assert off[0]["status_page"].startswith("off: it needs TCP; start with --tcp-port PORT")
