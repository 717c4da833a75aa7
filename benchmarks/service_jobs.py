"""Benchmark (f): ``orchestrator jobs`` end to end against a running service holding 1,000 x 1,000 subjobs.

It builds (or reuses) a home of 1,000 masters of 1,000 subjobs each on ``sim``
with a long ``run_seconds``, so all 100,000 subjobs stay active and the
service monitors them while it answers. It starts ``orchestrator serve`` on
it, then times whole processes, alternating in each round:

- ``python -c pass``: the interpreter's floor;
- ``python -c "import orchestrator.cli"``: the CLI's imports (plugin commands included);
- ``orchestrator --home H jobs``: the command as a user runs it, through the service.

It also times ``POST /api/jobs`` alone on the service's socket (the server's
share) and the service's CPU use during the rounds (its monitoring load).
Target: ``jobs`` under 0.5 s (median) at 1,000 x 1,000 (it was 1 s at 100 x 1,000).

    python benchmarks/service_jobs.py [HOME] [--masters 1000] [--rounds 7] [--rebuild] [--importtime]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
from _common import record

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator

MASTERS = 1_000
SUBJOBS = 1_000
#: Long enough that nothing ends while the benchmark runs (the runs stay active, monitored every tick).
RUN_SECONDS = 30 * 24 * 3600.0
TARGET_SECONDS = 0.5
BIN = Path(sys.executable).parent
ORCH = BIN / "orchestrator"
#: The commands run as a user runs them: with compiled bytecode cached (``__pycache__``). A session that
#: sets PYTHONDONTWRITEBYTECODE (as CI sandboxes do) makes every command compile all its modules again.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


# ------------------------------------------------------------------ the home
def stored_shape(home: Path) -> tuple[int, int]:
    """(masters, subjobs) in the home's repository, (0, 0) when there is none."""
    path = home / "repository.sqlite"
    if not path.exists():
        return 0, 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        masters, subjobs = db.execute("SELECT COUNT(*), COALESCE(SUM(n_subjobs), 0) FROM jobs "
                                      "WHERE n_subjobs > 0").fetchone()
    finally:
        db.close()
    return int(masters), int(subjobs)


async def build(home: Path, masters: int, subjobs: int) -> float:
    """``masters`` sim masters of ``subjobs`` each, submitted through the embedded API; the seconds it took."""
    t0 = time.perf_counter()
    async with Orchestrator(home) as orch:
        for m in range(masters):
            job = Job(name=f"bench-{m:03d}", application=Executable("/bin/true"),
                      splitter=ArgSplitter([[str(i)] for i in range(subjobs)]),
                      backend=Backend("sim", run_seconds=RUN_SECONDS))
            added = await orch.jobs.add(job)
            await added.submit()
            if (m + 1) % 100 == 0:
                print(f"  built {m + 1}/{masters} masters ({time.perf_counter() - t0:.1f} s)", flush=True)
    return time.perf_counter() - t0


# ------------------------------------------------------------------ the service
def start_service(home: Path, log: Path) -> tuple[subprocess.Popen[bytes], float]:
    """``orchestrator serve`` on ``home``, once ``/health`` answers; the seconds until then."""
    socket_path = home / "service" / "api.sock"
    t0 = time.perf_counter()
    with open(log, "ab") as out:
        proc = subprocess.Popen([str(ORCH), "--home", str(home), "serve"], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"FAILED: the service exited with {proc.returncode}; see {log}")
        try:
            info = json.loads((home / "service" / "service.json").read_text())
        except (FileNotFoundError, ValueError):
            info = {}
        if info.get("pid") == proc.pid:
            try:
                with unix_client(socket_path) as c:
                    if c.get("/health").status_code == 200:
                        return proc, time.perf_counter() - t0
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"FAILED: the service did not answer within 120 s; see {log}")


def stop_service(proc: subprocess.Popen[bytes]) -> tuple[int, float]:
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    return code, time.perf_counter() - t0


def unix_client(socket_path: Path) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), base_url="http://orchestrator",
                        timeout=60.0)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------ timing
def timed(argv: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    # cwd "/": run from a checkout, ``-c "import orchestrator"`` would import that checkout's code, not the venv's
    result = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd="/", env=ENV)
    seconds = time.perf_counter() - t0
    if result.returncode != 0:
        raise SystemExit(f"FAILED: {' '.join(argv)} exited {result.returncode}\n{result.stderr}")
    return seconds, result.stdout


def summary(values: list[float]) -> dict[str, float]:
    return {"min": round(min(values), 4), "median": round(statistics.median(values), 4),
            "max": round(max(values), 4)}


def import_profile(top: int) -> list[tuple[float, str]]:
    """The ``top`` imports of ``orchestrator.cli`` by cumulative time (``python -X importtime``), in seconds."""
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", "import orchestrator.cli"],
                            capture_output=True, text=True, cwd="/", env=ENV)
    rows = []
    for line in result.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self, cumulative, name = (part.strip() for part in line.removeprefix("import time:").split("|", 2))
        rows.append((int(cumulative) / 1e6, name))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("home", nargs="?", default="/tmp/orch-bench-service")
    p.add_argument("--masters", type=int, default=MASTERS, help=f"masters of {SUBJOBS} subjobs (default {MASTERS})")
    p.add_argument("--rounds", type=int, default=7, help="runs of each command, alternating (default 7)")
    p.add_argument("--rebuild", action="store_true", help="build the home afresh even if it has the right shape")
    p.add_argument("--importtime", action="store_true", help="also print the slowest imports of orchestrator.cli")
    p.add_argument("--label", default="")
    a = p.parse_args()
    home = Path(a.home).resolve()

    built_s: float | None = None
    if a.rebuild or stored_shape(home) != (a.masters, a.masters * SUBJOBS):
        if home.exists():
            import shutil

            shutil.rmtree(home)
        print(f"building {home}: {a.masters} masters x {SUBJOBS} subjobs on sim", flush=True)
        built_s = anyio.run(build, home, a.masters, SUBJOBS)
        print(f"built in {built_s:.1f} s", flush=True)
    masters, subjobs = stored_shape(home)

    proc, start_s = start_service(home, home / "bench-service.log")
    try:
        socket_path = home / "service" / "api.sock"
        with unix_client(socket_path) as c:
            monitored = c.get("/health").json()["monitored"]
        cpu0, wall0 = cpu_seconds(proc.pid), time.perf_counter()
        runs: dict[str, list[float]] = {"python -c pass": [], "import orchestrator.cli": [],
                                        "orchestrator jobs": [], "POST /api/jobs (server only)": []}
        rows = 0
        for argv in ([sys.executable, "-c", "import orchestrator.cli"], [str(ORCH), "--home", str(home), "jobs"]):
            timed(argv)  # not timed: writes the bytecode caches
        for _ in range(a.rounds):
            runs["python -c pass"].append(timed([sys.executable, "-c", "pass"])[0])
            runs["import orchestrator.cli"].append(timed([sys.executable, "-c", "import orchestrator.cli"])[0])
            seconds, out = timed([str(ORCH), "--home", str(home), "jobs"])
            runs["orchestrator jobs"].append(seconds)
            rows = sum(1 for line in out.splitlines()[1:]  # one line per master, named bench-NNN (not the totals)
                       if len(line.split()) > 1 and line.split()[0].isdigit() and line.split()[1].startswith("bench-"))
            with unix_client(socket_path) as c:
                t0 = time.perf_counter()
                answer = c.post("/api/jobs", json={})
                runs["POST /api/jobs (server only)"].append(time.perf_counter() - t0)
                assert answer.status_code == 200 and len(answer.json()) == masters
        service_cpu = (cpu_seconds(proc.pid) - cpu0) / (time.perf_counter() - wall0)
    finally:
        stop_code, stop_s = stop_service(proc)
    if rows != masters:
        raise SystemExit(f"FAILED: 'orchestrator jobs' listed {rows} jobs, expected {masters}")

    stats = {name: summary(values) for name, values in runs.items()}
    jobs_median = stats["orchestrator jobs"]["median"]
    ok = jobs_median < TARGET_SECONDS
    width = max(map(len, runs))
    print(f"\nhome {home}: {masters} masters, {subjobs} subjobs, {monitored} monitored by the service "
          f"(up in {start_s:.2f} s; stopped by SIGTERM in {stop_s:.2f} s, exit {stop_code})")
    print(f"{'':{width}}  {'min':>7}  {'median':>7}  {'max':>7}   ({a.rounds} runs each)")
    for name, s in stats.items():
        print(f"{name:{width}}  {s['min']:7.3f}  {s['median']:7.3f}  {s['max']:7.3f}")
    floor = stats["import orchestrator.cli"]["median"]
    print(f"service CPU while it served these: {service_cpu:.0%} of one core")
    if a.importtime:
        print("\nslowest imports of orchestrator.cli (cumulative, one cold-ish run):")
        for seconds, name in import_profile(15):
            print(f"  {seconds * 1000:7.1f} ms  {name}")
    line = (f"service_jobs: {masters}x{SUBJOBS} on sim, 'orchestrator jobs' median {jobs_median:.3f}s "
            f"(min {stats['orchestrator jobs']['min']:.3f}s; floor: python -c pass "
            f"{stats['python -c pass']['median']:.3f}s, import orchestrator.cli {floor:.3f}s; "
            f"server {stats['POST /api/jobs (server only)']['median'] * 1000:.0f}ms) "
            f"target <{TARGET_SECONDS}s: {'MET' if ok else 'MISSED'}")
    fields: dict[str, Any] = {
        "home": str(home), "masters": masters, "subjobs": subjobs, "monitored": monitored, "rounds": a.rounds,
        "build_s": round(built_s, 2) if built_s is not None else None, "service_start_s": round(start_s, 3),
        "service_stop_s": round(stop_s, 3), "service_stop_code": stop_code, "service_cpu": round(service_cpu, 3),
        "seconds": stats, "target_s": TARGET_SECONDS, "met": ok, "label": a.label}
    record("service_jobs", line, **fields)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
