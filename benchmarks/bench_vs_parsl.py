"""Benchmark (h): 1,000 ``/bin/true`` on ``local`` against raw asyncio spawning and Parsl's ThreadPoolExecutor.

In one process and run, in alternating rounds (default 5), each timed from
the first submission to the last completion:

* raw: ``asyncio.create_subprocess_exec('/bin/true')`` N times, at most 64 at
  once: the floor of spawning from Python on this machine;
* ours: one master of N subjobs on ``local`` (``bench_local_spawn.ours``: every
  run through the job wrapper, with its own ``orch.log``, ``stdout`` and
  ``stderr``), ``submit`` then ``wait``, in a fresh home on the ordinary disk;
* Parsl: N ``bash_app``s returning ``/bin/true`` on a ``ThreadPoolExecutor``
  (``max_threads`` 64, as raw's limit), loaded once; ``f.result()`` for all.

Reports the median of each over the rounds, ours/raw (target at most 2.0)
and Parsl/ours (target at least 2.0), and the median CPU seconds of each
side (this process, Parsl's threads included, and its children). Parsl comes from the ``bench`` extra
(``pip install -e ".[bench]"``).

    python benchmarks/bench_vs_parsl.py [--n 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import peak_rss_mib, record
from bench_local_spawn import Meter, ours, raw

TARGET_RAW = 2.0
TARGET_PARSL = 2.0


def parsl_round(n: int, bash_app: Any) -> dict[str, float]:
    with Meter() as m:
        futures = [bash_app() for _ in range(n)]
        for f in futures:
            if f.result() != 0:
                raise SystemExit("FAILED: a Parsl app did not exit 0")
    return {"total_s": m.wall, "cpu_self_s": m.cpu_self, "cpu_self_sys_s": m.cpu_self_sys,
            "cpu_children_s": m.cpu_children}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=64, help="Parsl's max_threads (raw's limit is the same)")
    p.add_argument("--label", default="")
    a = p.parse_args()
    try:
        import parsl
        from parsl.config import Config
        from parsl.executors.threads import ThreadPoolExecutor
    except ImportError:
        raise SystemExit("Parsl is not installed: pip install -e '.[bench]'") from None

    rundir = Path(tempfile.mkdtemp(prefix="orch-bench-parsl-"))
    parsl.load(Config(executors=[ThreadPoolExecutor(max_threads=a.threads)], run_dir=str(rundir),
                      initialize_logging=False))

    true_app = parsl.bash_app(lambda: "/bin/true")  # (Parsl is untyped: a call, not a decorator, under --strict)

    config = {"core": {"poll_interval": 0.05, "flush_interval": 0.2, "emulated_bulk_concurrency": 16},
              "backends": {"local": {"max_running": 256}}}
    asyncio.run(raw(50, 64))  # warm the page cache
    parsl_round(50, true_app)
    sides: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("raw", lambda: asyncio.run(raw(a.n, 64))), ("ours", lambda: asyncio.run(ours(a.n, config, None))),
        ("parsl", lambda: parsl_round(a.n, true_app))]
    times: dict[str, list[float]] = {side: [] for side, _ in sides}
    cpu: dict[str, list[tuple[float, float]]] = {side: [] for side, _ in sides}
    for r in range(a.rounds):
        for side, result in sides:
            got = result()
            times[side].append(got["total_s"])
            cpu[side].append((got["cpu_self_s"], got["cpu_children_s"]))
        print(f"  round {r + 1}: raw {times['raw'][-1]:.2f} s, ours {times['ours'][-1]:.2f} s, "
              f"parsl {times['parsl'][-1]:.2f} s", flush=True)
    parsl.dfk().cleanup()
    med = {k: statistics.median(v) for k, v in times.items()}
    # CPU seconds per round (this process, with Parsl's threads; its children), medians over the rounds
    cpu_med = {k: {"self": round(statistics.median(c[0] for c in v), 3),
                   "children": round(statistics.median(c[1] for c in v), 3)} for k, v in cpu.items()}
    ours_raw, parsl_ours = med["ours"] / med["raw"], med["parsl"] / med["ours"]
    ok = ours_raw <= TARGET_RAW and parsl_ours >= TARGET_PARSL
    line = (f"bench_vs_parsl: n={a.n} x{a.rounds} medians raw={med['raw']:.2f}s ours={med['ours']:.2f}s "
            f"parsl={med['parsl']:.2f}s ours/raw={ours_raw:.2f} (target <={TARGET_RAW}) parsl/ours={parsl_ours:.2f} "
            f"(target >={TARGET_PARSL}): {'MET' if ok else 'MISSED'}; cpu self+children "
            + ", ".join(f"{k} {v['self']:.2f}+{v['children']:.2f}s" for k, v in cpu_med.items()))
    rounded = {k: [round(x, 3) for x in v] for k, v in times.items()}
    record("bench_vs_parsl", line, n=a.n, rounds=a.rounds, times=rounded,
           medians={k: round(v, 3) for k, v in med.items()}, ours_over_raw=round(ours_raw, 3),
           parsl_over_ours=round(parsl_ours, 3), cpu_medians=cpu_med, parsl_version=parsl.__version__,
           threads=a.threads,
           home_root=tempfile.gettempdir(), peak_rss_mib=round(peak_rss_mib(), 1), met=ok, label=a.label)


if __name__ == "__main__":
    main()
