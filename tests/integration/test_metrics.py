"""``GET /metrics``: scraped by a real Prometheus (Debian's package) on loopback, queried through its own API."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from served import Service

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator

pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(shutil.which("prometheus") is None,
                                 reason="prometheus is not installed (scripts/install-test-deps.sh installs it)")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[object]:
    """``start(target_port, token)`` starts Prometheus scraping the service every second; stopped by PID."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(target: int, token: str) -> str:
        port = free_port()
        where = tmp_path / "prometheus"
        where.mkdir()
        (where / "token").write_text(token)
        (where / "prometheus.yml").write_text(f"""
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: orchestrator
    authorization:
      credentials_file: {where / 'token'}
    static_configs:
      - targets: ["127.0.0.1:{target}"]
""")
        log = (where / "log").open("wb")
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={where / 'prometheus.yml'}", f"--storage.tsdb.path={where / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT))
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def query(base: str, expr: str) -> dict[tuple[str, str], float]:
    answer = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=5).json()
    assert answer["status"] == "success", answer
    return {(r["metric"].get("backend", ""), r["metric"].get("status", "")): float(r["value"][1])
            for r in answer["data"]["result"]}


async def test_prometheus_scrapes_the_subjob_counts_by_status(tmp_path: Path, services: list[Service],
                                                               prometheus_for: object) -> None:
    home = tmp_path / "home"
    service = Service(home, "--tcp-port", "0")
    services.append(service.start())
    async with Orchestrator(home=home) as orch:
        outcome = {i: "failed" for i in range(5)}
        queued = {i: 600 for i in range(20, 30)}  # stay submitted while Prometheus looks
        j = await orch.jobs.add(Job(name="scraped", application=Executable("/bin/true"),
                                    splitter=ArgSplitter([[str(i)] for i in range(30)]),
                                    backend=Backend("sim", run_seconds=0.05, outcome=outcome, queued=queued)))
        await j.submit()
        with anyio.fail_after(30):
            while len(j.subjobs.select(status=["completed", "failed"])) < 20:
                await anyio.sleep(0.1)
        ours = {s: len(j.subjobs.select(status=s)) for s in ("completed", "failed", "submitted")}
        assert ours == {"completed": 15, "failed": 5, "submitted": 10}

        text = httpx.get(f"{service.url}/metrics", headers={"Authorization": f"Bearer {service.token}"}).text
        assert 'orchestrator_runs{backend="sim",status="completed"} 15.0' in text
        assert httpx.get(f"{service.url}/metrics").status_code == 401  # the token, as for every route

        base = prometheus_for(service.port, service.token)  # type: ignore[operator]
        deadline = time.monotonic() + 40
        seen: dict[tuple[str, str], float] = {}
        while time.monotonic() < deadline:
            try:
                seen = query(base, "orchestrator_runs")
            except (httpx.HTTPError, ValueError):  # not up yet: refused, or "Service Unavailable" as text
                seen = {}
            if seen:
                break
            await anyio.sleep(0.5)
        assert {status: int(n) for (backend, status), n in seen.items() if backend == "sim" and n} == ours
        latency = query(base, "orchestrator_submission_seconds_count")
        assert sum(latency.values()) >= 1
        assert sum(query(base, "orchestrator_final_failures_total").values()) == 5
        await j.kill()
