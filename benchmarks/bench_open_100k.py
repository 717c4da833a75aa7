"""Benchmark (c): reopen the 100,000-subjob home left by ``bench_sim_100k.py``.

Run it as a fresh process after ``bench_sim_100k.py``. It times, from just
before ``Orchestrator(home)`` and its ``__aenter__`` to just after printing the master's
status and per-status counts (``len(job.subjobs.select(status=s))`` for every status), the
whole reopen: home lock, repository open and migration check, loading the
top-level jobs and every subjob's status into the state machine, recovery of
active runs. Target: under 1 s. Imports are timed apart.

    python benchmarks/bench_open_100k.py [HOME]     # default /tmp/orch-bench-100k
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import anyio  # noqa: E402
from _common import peak_rss_mib, record, status_counts  # noqa: E402

from orchestrator import Orchestrator  # noqa: E402

T_IMPORTED = time.perf_counter()
TARGET_SECONDS = 1.0


async def run(home: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    orch = Orchestrator(home)
    await orch.__aenter__()
    try:
        t1 = time.perf_counter()
        masters = [j for j in orch.jobs if len(j.subjobs)]
        if not masters:
            raise SystemExit(f"FAILED: no master job in {home}; run bench_sim_100k.py first")
        j = max(masters, key=lambda m: len(m.subjobs))
        counts = status_counts(orch, j)
        print(f"job {j.id} {j.name!r}: {j.status.value}, {len(j.subjobs)} subjobs, "
              + ", ".join(f"{s}={n}" for s, n in counts.items()), flush=True)
        t2 = time.perf_counter()
    finally:
        await orch.__aexit__(None, None, None)
    t3 = time.perf_counter()
    return {"open_s": t1 - t0, "total_s": t2 - t0, "close_s": t3 - t2, "status": j.status.value,
            "n": len(j.subjobs), "counts": counts}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("home", nargs="?", default="/tmp/orch-bench-100k")
    p.add_argument("--label", default="")
    a = p.parse_args()
    home = Path(a.home)
    if not (home / "repository.sqlite").exists():
        raise SystemExit(f"FAILED: {home} has no repository; run bench_sim_100k.py {home} first")
    r = anyio.run(run, home)
    ok = r["total_s"] < TARGET_SECONDS
    line = (f"bench_open_100k: n={r['n']} status={r['status']} open+count+print={r['total_s']:.3f}s "
            f"(of which __aenter__ {r['open_s']:.3f}s; close {r['close_s']:.3f}s; imports "
            f"{T_IMPORTED - T_START:.3f}s) peak_rss={peak_rss_mib():.0f}MiB target <{TARGET_SECONDS:.0f}s: "
            f"{'MET' if ok else 'MISSED'}")
    record("bench_open_100k", line, n=r["n"], home=str(home), status=r["status"], counts=r["counts"],
           total_s=round(r["total_s"], 4), aenter_s=round(r["open_s"], 4), close_s=round(r["close_s"], 4),
           import_s=round(T_IMPORTED - T_START, 4), peak_rss_mib=round(peak_rss_mib(), 1),
           target_s=TARGET_SECONDS, met=ok, label=a.label)
    sys.exit(0)


if __name__ == "__main__":
    main()
