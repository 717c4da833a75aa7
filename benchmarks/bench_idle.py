"""Benchmark (g): what an idle service costs: 100,000 monitored ``sim`` runs and 1,000 running ``local`` runs.

Builds a home (kept in HOME, default /tmp/orch-bench-idle) through the
embedded API: one master of 100,000 ``sim`` subjobs that run for 30 days, and
one master of 1,000 ``local`` subjobs of ``sleep 3600`` (``max_running`` 1,000),
waits until every local run is ``running``, closes the home (the runs go on),
then starts ``orchestrator serve`` on it, lets it settle, and reads the
service's CPU time from ``/proc`` over a quiet window in which nothing changes.
At the end it kills the local master through the service and stops the
service with SIGTERM. Target (issue "Performance"): at most 2 % of one core.

With ``--profile FILE`` it then opens the same home in this process (the
same runtime, without the HTTP server), lets it settle and writes a cProfile
of one more quiet window, on the CPU clock: where the idle CPU goes.

    python benchmarks/bench_idle.py [HOME] [--window 30] [--settle 10] [--profile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import shutil
import subprocess
import sys
import time
from pathlib import Path

import anyio
from _common import record
from service_jobs import ORCH, cpu_seconds, start_service, stop_service, unix_client

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator

TARGET_PERCENT = 2.0
SIM_RUNS = 100_000
LOCAL_RUNS = 1_000
MONTH = 30 * 24 * 3600.0


async def build(home: Path, sim: int, local: int) -> float:
    """The two masters, submitted; returns once every local run is running."""
    t0 = time.perf_counter()
    config = {"backends": {"local": {"max_running": local}}}
    async with Orchestrator(home, config=config) as orch:
        s = await orch.jobs.add(Job(name="idle-sim", application=Executable("/bin/true"),
                                    splitter=ArgSplitter([[str(i)] for i in range(sim)]),
                                    backend=Backend("sim", run_seconds=MONTH)))
        await s.submit()
        lo = await orch.jobs.add(Job(name="idle-local", application=Executable("/bin/sleep"),
                                     splitter=ArgSplitter([["3600"] for _ in range(local)]), backend="local"))
        await lo.submit(keep_going=True)
        with anyio.fail_after(300):
            while len(lo.subjobs.select(status="running")) < local:
                await orch.refresh()
                await anyio.sleep(0.5)
    return time.perf_counter() - t0


async def profile_idle(home: Path, settle: float, window: float, out: str) -> float:
    """The home opened here, ``settle`` seconds, then a CPU-clock profile of ``window`` quiet seconds; the share of
    a core used meanwhile. The local master is killed afterwards."""
    async with Orchestrator(home) as orch:
        await anyio.sleep(settle)
        prof = cProfile.Profile(time.process_time)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        prof.enable()
        await anyio.sleep(window)
        prof.disable()
        percent = 100 * (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        prof.dump_stats(out)
        await orch.jobs[1].kill()
    return percent


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("home", nargs="?", default="/tmp/orch-bench-idle")
    p.add_argument("--sim", type=int, default=SIM_RUNS)
    p.add_argument("--local", type=int, default=LOCAL_RUNS)
    p.add_argument("--settle", type=float, default=10.0, help="seconds after /health before measuring")
    p.add_argument("--window", type=float, default=30.0, help="seconds of measurement")
    p.add_argument("--profile", metavar="FILE", help="then profile a quiet window in this process (CPU clock)")
    p.add_argument("--label", default="")
    a = p.parse_args()
    home = Path(a.home).resolve()
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    (home / "orchestrator.toml").write_text(f"[backends.local]\nmax_running = {a.local}\n")
    print(f"building {home}: {a.sim} sim runs (30 days each) and {a.local} local runs of sleep 3600", flush=True)
    build_s = anyio.run(build, home, a.sim, a.local)
    print(f"built in {build_s:.1f} s", flush=True)
    proc, start_s = start_service(home, home / "bench-service.log")
    try:
        with unix_client(home / "service" / "api.sock") as c:
            monitored = c.get("/health").json()["monitored"]
        time.sleep(a.settle)
        cpu0, wall0 = cpu_seconds(proc.pid), time.perf_counter()
        time.sleep(a.window)
        percent = 100 * (cpu_seconds(proc.pid) - cpu0) / (time.perf_counter() - wall0)
        if not a.profile:
            subprocess.run([str(ORCH), "--home", str(home), "kill", "1"], capture_output=True, timeout=120, cwd="/")
    finally:
        stop_code, stop_s = stop_service(proc)
    embedded = anyio.run(profile_idle, home, a.settle, a.window, a.profile) if a.profile else None
    ok = percent <= TARGET_PERCENT
    line = (f"bench_idle: service with {monitored} monitored runs ({a.sim} sim, {a.local} local running), nothing "
            f"changing: {percent:.2f}% of one core over {a.window:.0f} s (up in {start_s:.2f} s, stopped in "
            f"{stop_s:.2f} s, exit {stop_code}) target <={TARGET_PERCENT:.0f}%: {'MET' if ok else 'MISSED'}"
            + (f"; embedded, profiled: {embedded:.2f}%" if embedded is not None else ""))
    record("bench_idle", line, home=str(home), sim=a.sim, local=a.local, monitored=monitored,
           build_s=round(build_s, 2), service_start_s=round(start_s, 3), window_s=a.window, settle_s=a.settle,
           cpu_percent=round(percent, 3), stop_s=round(stop_s, 3), stop_code=stop_code, target_percent=TARGET_PERCENT,
           embedded_profiled_percent=None if embedded is None else round(embedded, 3), met=ok, label=a.label)
    shutil.rmtree(home, ignore_errors=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
