"""``GET /metrics``: scraped by a real Prometheus (Debian's package) on loopback, queried through its own API;
and read as a scraper reads it while the sim backend's documented faults make runs lost and reconciled."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from served import Service
from test_fault_tolerance import sim_faults
from test_reconcile import submit_and_die
from test_repository_refusals import refuse_in_sqlite

from orchestrator import ArgSplitter, Backend, Executable, Job, JobError, Orchestrator, RetryPolicy

pytestmark = pytest.mark.anyio
needs_prometheus = pytest.mark.skipif(shutil.which("prometheus") is None,
                                      reason="prometheus is not installed (scripts/install-test-deps.sh installs it)")


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


@needs_prometheus
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


# --------------------------------------------------------------------------- every family, read off the service
LABELS = {"backend", "status", "type", "level", "verdict", "outcome", "found", "kind", "call", "le"}


def scrape(service: Service) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """``GET /metrics`` on the service's socket, parsed: {sample name: {sorted labels: value}}."""
    with service.client() as c:
        text = c.get("/metrics").text
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def value(metrics: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str, **labels: str) -> float:
    return metrics.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


async def until(check: Any, timeout: float = 30.0) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.1)


async def test_a_service_counts_the_changes_its_repository_refused(tmp_path: Path, services: list[Service]) -> None:
    home = tmp_path / "home"
    async with Orchestrator(home=home):
        pass
    service = Service(home)
    services.append(service.start())
    assert value(scrape(service), "orchestrator_repository_refusals_total") == 0
    async with Orchestrator(home=home) as orch:
        refused = await orch.jobs.add(Job(name="refused", application=Executable("/bin/true"), backend="local"))
        refuse_in_sqlite(home)
        await refused.submit()
        await refused.wait(timeout=30)
        await until(lambda: value(scrape(service), "orchestrator_repository_refusals_total") >= 1)


async def test_every_metric_of_a_running_service(tmp_path: Path, services: list[Service]) -> None:
    home = tmp_path / "home"
    submit_and_die(home, 6, crash_after=2)  # a crash mid-submission: the backend had 2 of the 6 runs
    (home / "orchestrator.toml").write_text("[core]\npoll_interval = 0.1\nlost_after_seconds = 1.0\n")
    service = Service(home)
    services.append(service.start())
    async with Orchestrator(home=home) as orch:
        crashed = orch.jobs[0]
        await until(lambda: not crashed.subjobs.select(status="submitting"))  # 2 adopted, 4 sent again
        first = scrape(service)
        assert value(first, "orchestrator_runs_reconciled_total", backend="sim", found="yes") == 2
        assert value(first, "orchestrator_runs_reconciled_total", backend="sim", found="no") == 4
        await crashed.kill()

        # Retries by level and verdict: subjob 0 fails once (application level, early), then completes.
        retried = await orch.jobs.add(Job(name="retried", application=Executable("/bin/true"),
                                          splitter=ArgSplitter([["0"], ["1"]]), retry=RetryPolicy(max_early=1),
                                          backend=Backend("sim", run_seconds=0.05,
                                                          outcome={0: ["failed", "completed"]})))
        await retried.submit()
        await retried.wait(timeout=20)
        assert retried.status == "completed"

        # Lost: a polled backend whose status queries raise for longer than lost_after_seconds.
        watched = await orch.jobs.add(Job(name="watched", application=Executable("/bin/true"),
                                          splitter=ArgSplitter([["0"], ["1"]]),
                                          retry=RetryPolicy(max_infrastructure=0),
                                          backend=Backend("sim", polled=True, run_seconds=600)))
        await watched.submit()
        await until(lambda: watched.subjobs.select(status="running").__len__() == 2)
        sim_faults(home, status="raise")
        await until(lambda: watched.status == "failed")
        sim_faults(home)
        assert all("no answer from backend sim" in (s.info.reason or "") for s in watched.subjobs)

        # A submission that fails as a whole: a backend fault too.
        sim_faults(home, submit="raise")
        refused = await orch.jobs.add(Job(name="refused", application=Executable("/bin/true"), backend="sim"))
        with pytest.raises(JobError):
            await refused.submit()
        sim_faults(home)
        runs = [r for j in orch.jobs for r in (list(j.subjobs) or [j])]
        ids = [j.fqid for j in orch.jobs] + [r.fqid for r in runs]
        finals = Counter((r.info.history[-1]["level"], r.info.history[-1]["verdict"]) for r in runs
                         if r.status == "failed" and r.info.history[-1]["action"] == "failed")

    later = scrape(service)
    resent_retried_watched = 4 + 3 + 2
    assert value(later, "orchestrator_submissions_total", backend="sim", outcome="accepted") == resent_retried_watched
    assert value(later, "orchestrator_retries_total", level="application", verdict="early") == 1
    assert value(later, "orchestrator_runs_lost_total", backend="sim") == 2
    assert finals[("orchestrator", "late_unhandled")] == 2  # the lost runs, among others
    assert {dict(k)["level"] + "/" + dict(k)["verdict"]: v for k, v in
            later["orchestrator_final_failures_total"].items()} == {f"{lv}/{vd}": n for (lv, vd), n in finals.items()}
    assert value(later, "orchestrator_backend_faults_total", backend="sim", call="status") >= 2
    assert value(later, "orchestrator_backend_faults_total", backend="sim", call="submit") == 1
    assert value(later, "orchestrator_runs_reconciled_total", backend="sim", found="yes") == 2
    assert value(later, "orchestrator_monitor_tick_seconds", backend="sim") > 0  # the polled job's ticks
    assert value(later, "orchestrator_monitor_ticks", backend="sim") >= 2
    assert "orchestrator_bus_queue_depth" in later and value(later, "orchestrator_bus_queue_depth") >= 0
    assert value(later, "orchestrator_submission_seconds_count", backend="sim") >= 4
    events = {dict(k)["type"]: v for k, v in later["orchestrator_events_total"].items()}
    assert events["RunsSilent"] >= 1 and events["LookupOutcomes"] >= 1 and events["SubmitRequested"] >= 3
    before = sum(first["orchestrator_events_total"].values())
    assert sum(events.values()) > before  # events per second: the rate of this counter, rising while runs go

    # Label sets are bounded: known names only, and no value is a job's id.
    for name, samples in later.items():
        for labels in samples:
            assert {k for k, _ in labels} <= LABELS, (name, labels)
            assert not [v for k, v in labels if k != "le" and (v in ids or re.fullmatch(r"[0-9.]+", v))], \
                (name, labels)
