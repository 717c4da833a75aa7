"""Benchmark (b): ``local`` backend, 2,000 subjobs of ``/bin/true``, against raw asyncio spawning.

In the same process and run, alternately:

* raw: ``asyncio.create_subprocess_exec('/bin/true')`` 2,000 times, each
  awaited, at most 64 at once (an ``asyncio.Semaphore``);
* ours: one master of 2,000 subjobs of ``/bin/true`` on ``local``,
  ``await j.submit(keep_going=True)`` (emulated bulk, with concurrency) then
  ``await j.wait()``, timed from submit to every subjob ``completed``.

Reports both times, the ratio ours/raw (sums over the rounds; target: at
most 2.5) and the CPU seconds of this process and of its children in each
(for ours, with the home's ``local`` launcher and the runs it started).
Each "ours" round uses a fresh home under ``--home-root`` (default: the
system temporary directory), removed afterwards (``ours`` counts its files
and directories first: ``entries``).

    python benchmarks/bench_local_spawn.py [--n 2000] [--rounds 2] [--max-running 256]
        [--poll-interval 0.05] [--flush-interval 0.2] [--concurrency 16] [--home-root DIR]
        [--profile FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import peak_of, peak_rss_mib, proc_times, record, status_counts

TARGET_RATIO = 2.5
EXE = "/bin/true"
HOME_ROOT: str | None = None


def _cpu() -> tuple[float, float, float]:
    """CPU seconds (user + system) of this process, its system part, and its reaped children's."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, me.ru_stime, kids.ru_utime + kids.ru_stime


class Meter:
    """Wall and CPU time of one phase."""

    def __enter__(self) -> Meter:
        self.t0, (self.c0, self.s0, self.k0) = time.perf_counter(), _cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        c1, s1, k1 = _cpu()
        self.wall, self.cpu_self, self.cpu_children = time.perf_counter() - self.t0, c1 - self.c0, k1 - self.k0
        self.cpu_self_sys = s1 - self.s0


async def raw(n: int, concurrency: int) -> dict[str, float]:
    sem = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with sem:
            proc = await asyncio.create_subprocess_exec(EXE)
            rc = await proc.wait()
            if rc != 0:
                raise SystemExit(f"FAILED: raw {EXE} exited {rc}")

    with Meter() as m:
        await asyncio.gather(*(one() for _ in range(n)))
    return {"total_s": m.wall, "cpu_self_s": m.cpu_self, "cpu_self_sys_s": m.cpu_self_sys,
            "cpu_children_s": m.cpu_children}


async def ours(n: int, config: dict[str, Any], profile: cProfile.Profile | None) -> dict[str, float]:
    from orchestrator import ArgSplitter, Executable, Job, Orchestrator  # here: raw's process need not hold it

    home = Path(tempfile.mkdtemp(prefix="orch-bench-local-", dir=HOME_ROOT))
    try:
        async with Orchestrator(home, config=config) as orch:
            j = await orch.jobs.add(Job(name="spawn", application=Executable(EXE),
                                        splitter=ArgSplitter([[] for _ in range(n)]), backend="local"))
            if profile is not None:
                profile.enable()
            with Meter() as m:
                t0 = time.perf_counter()
                await j.submit(keep_going=True)
                t1 = time.perf_counter()
                await j.wait(timeout=600)
                t2 = time.perf_counter()
            launcher = launcher_usage(home)  # still running: it ends once the orchestrator has closed
            if profile is not None:
                profile.disable()
            counts = status_counts(orch, j)
            if counts != {"completed": n}:
                raise SystemExit(f"FAILED: master {j.status.value}, counts {counts}")
        deadline = time.monotonic() + 10  # the launcher ends once the orchestrator has let go of it
        while launcher_usage(home)[4] and time.monotonic() < deadline:
            time.sleep(0.01)
        peak = peak_mib()  # before the count below, whose listing of a 100,000-entry directory is not ours to pay
        entries = sum(len(dirs) + len(files) for _, dirs, files in os.walk(home))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return {"submit_s": t1 - t0, "total_s": t2 - t0, "cpu_self_s": m.cpu_self + launcher[0],
            "cpu_self_sys_s": m.cpu_self_sys + launcher[1], "cpu_children_s": m.cpu_children + launcher[2],
            "cpu_launcher_s": launcher[0], "entries": entries, "rss_mib": peak + launcher[3]}


def launcher_usage(home: Path) -> tuple[float, float, float, float, int]:
    """The CPU of the home's ``local`` launcher (its own, its system part, its reaped runs') and its peak RSS in
    MiB: the orchestrator's process too, though not a child of this one (it started within the timed part, so all
    of it counts). Read in ``/proc`` while it still runs; the last field counts the launchers found."""
    own = sys_ = kids = rss = 0.0
    found = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if not (any(a.endswith(b"orch_local/launcher.py") for a in args)
                and any(a.startswith(os.fsencode(home)) for a in args)):
            continue
        if (times := proc_times(int(entry.name))) is None:
            continue
        utime, stime, cutime, cstime = times
        own, sys_, kids, found = own + utime + stime, sys_ + stime, kids + cutime + cstime, found + 1
        rss += peak_of(int(entry.name))
    return own, sys_, kids, rss, found


def peak_mib() -> float:
    """This process's peak RSS so far in MiB (``VmHWM``; not ``ru_maxrss``, which a vforked parent's peak
    inflates)."""
    with open("/proc/self/status") as f:
        return next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")), 0.0)


async def bench(a: argparse.Namespace, profile: cProfile.Profile | None) -> dict[str, Any]:
    config = {
        "core": {"poll_interval": a.poll_interval, "flush_interval": a.flush_interval,
                 "emulated_bulk_concurrency": a.concurrency},
        "backends": {"local": {"max_running": a.max_running}},
    }
    await raw(50, a.raw_concurrency)  # warm the page cache and the loop's child watcher
    raws: list[dict[str, float]] = []
    runs: list[dict[str, float]] = []
    for _ in range(a.rounds):
        raws.append(await raw(a.n, a.raw_concurrency))
        runs.append(await ours(a.n, config, profile))
    return {"raw": raws, "ours": runs, "config": config}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=2, help="pairs of (raw, ours), alternating")
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--poll-interval", type=float, default=0.05)
    p.add_argument("--flush-interval", type=float, default=0.2)
    p.add_argument("--concurrency", type=int, default=16, help="core.emulated_bulk_concurrency")
    p.add_argument("--raw-concurrency", type=int, default=64)
    p.add_argument("--home-root", default=None, help="where the homes go (e.g. /dev/shm); default: the temp dir")
    p.add_argument("--profile", metavar="FILE", help="write a cProfile (CPU clock) of the orchestrator runs to FILE")
    p.add_argument("--label", default="")
    a = p.parse_args()
    global HOME_ROOT
    HOME_ROOT = a.home_root
    profile = cProfile.Profile(time.process_time) if a.profile else None  # CPU time: spawning blocks on the child
    r = asyncio.run(bench(a, profile))
    if profile is not None:
        profile.dump_stats(a.profile)
    raw_s = sum(x["total_s"] for x in r["raw"])
    ours_s = sum(x["total_s"] for x in r["ours"])
    ratio = ours_s / raw_s
    ok = ratio <= TARGET_RATIO
    per_round = ", ".join(f"{rw['total_s']:.2f}/{o['total_s']:.2f}" for rw, o in zip(r["raw"], r["ours"], strict=True))
    fields = ("cpu_self_s", "cpu_self_sys_s", "cpu_children_s")
    cpu = {k: {f: round(sum(x[f] for x in r[k]) / a.rounds, 3) for f in fields} for k in ("raw", "ours")}
    line = (f"bench_local_spawn: n={a.n} x{a.rounds} raw={raw_s / a.rounds:.2f}s ({a.n * a.rounds / raw_s:.0f}/s) "
            f"home-root={a.home_root or tempfile.gettempdir()} "
            f"ours={ours_s / a.rounds:.2f}s ({a.n * a.rounds / ours_s:.0f}/s) ratio={ratio:.2f} "
            f"[raw/ours per round: {per_round}] cpu self+children raw={cpu['raw']['cpu_self_s']:.2f}+"
            f"{cpu['raw']['cpu_children_s']:.2f}s ours={cpu['ours']['cpu_self_s']:.2f}+"
            f"{cpu['ours']['cpu_children_s']:.2f}s (ours self: {cpu['ours']['cpu_self_sys_s']:.2f}s in the kernel) "
            f"target <={TARGET_RATIO}: {'MET' if ok else 'MISSED'}"
            f"{' [profiled]' if profile else ''}")
    record("bench_local_spawn", line, n=a.n, rounds=a.rounds, raw_s=[round(x["total_s"], 3) for x in r["raw"]],
           cpu_per_round=cpu, home_root=a.home_root or tempfile.gettempdir(),
           ours_s=[round(x["total_s"], 3) for x in r["ours"]],
           ours_submit_s=[round(x["submit_s"], 3) for x in r["ours"]], ratio=round(ratio, 3),
           target_ratio=TARGET_RATIO, met=ok, raw_concurrency=a.raw_concurrency, settings=r["config"],
           peak_rss_mib=round(peak_rss_mib(), 1), profiled=bool(profile), label=a.label)


if __name__ == "__main__":
    main()
