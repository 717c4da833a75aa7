"""Benchmark (e): ``slurm`` backend, 1,000 subjobs of ``/bin/true`` on a private one-node cluster.

A private Slurm (``tests/support/slurmd.py``: own munged, slurmctld and slurmd on
loopback, one node ``localhost`` with the machine's 2 CPUs) serves both
sides, which run one after the other in the same process:

* ours: one master of N subjobs of ``/bin/true`` on ``Backend("slurm", ...)``,
  timed from ``await j.submit()`` to every subjob ``completed``; it includes
  the job wrapper of every run and the driver's ``squeue`` ticks. The Slurm
  commands it ran are reported from the driver's ``calls`` counters: the
  claim is one ``sbatch`` per ``MaxArraySize`` chunk (one for N <= 1001) and
  one ``squeue`` per tick.
* raw (``--raw``): ``sbatch --array=0-(N-1) --wrap /bin/true`` and ``squeue``
  once a second until the array has left the queue: what the cluster itself
  takes for the same number of trivial tasks, without a wrapper.

A warm-up array of 30 tasks runs first: a cluster that has just come up
runs its first ~30 s of tasks about half as fast (30 tasks: 15 s, then 10 s,
then 8 s), which would be charged to whichever side ran first. The ratio is ours over raw (above 1:
the wrapper and monitoring cost that much more). With 2 CPUs the scheduler,
not the orchestrator, sets the pace.

    python benchmarks/bench_slurm.py [--n 1000] [--poll-interval 0.5] [--max-array 0] [--raw] [--label TEXT]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _common import peak_rss_mib, record

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from slurmd import SlurmCluster, slurm_unavailable, start_cluster  # noqa: E402

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator  # noqa: E402

EXE = "/bin/true"


async def ours(cluster: SlurmCluster, n: int, poll: float, max_array: int) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="orch-bench-slurm-"))
    config: dict[str, Any] = {"core": {"poll_interval": poll}}
    if max_array:
        config["backends"] = {"slurm": {"max_array_size": max_array}}
    async with Orchestrator(home=home, config=config) as orch:
        j = await orch.jobs.add(Job(name="bench", application=Executable(EXE),
                                    splitter=ArgSplitter([[str(i)] for i in range(n)]),
                                    backend=Backend("slurm", slurm_conf=str(cluster.conf))))
        t0 = time.perf_counter()
        await j.submit()
        submitted = time.perf_counter() - t0
        await j.wait(timeout=3600)
        total = time.perf_counter() - t0
        done = sum(1 for s in j.subjobs if s.status == "completed")
        driver = (await orch.metrics())["backends"]["slurm"]["driver"]
        calls = dict(driver["calls"])
        per_tick = {k: max((t.get(k, 0) for t in driver["tick_calls"]), default=0) for k in ("squeue", "sacct")}
        return {"seconds": total, "submit_seconds": submitted, "completed": done, "calls": calls,
                "ticks": driver["ticks"], "max_per_tick": per_tick,
                "max_runs_per_tick": max(driver["tick_runs"], default=0)}


def warm_up(cluster: SlurmCluster) -> None:
    """30 tasks first: a fresh cluster schedules its first ~30 s of jobs about half as fast (measured)."""
    raw(cluster, 30)


def raw(cluster: SlurmCluster, n: int) -> float:
    """One plain array of ``/bin/true``, watched with ``squeue`` once a second until it has left the queue."""
    t0 = time.perf_counter()
    out = subprocess.run(["sbatch", "--parsable", f"--array=0-{n - 1}", "--output=/dev/null", "--wrap", EXE],
                         env=cluster.env, capture_output=True, text=True, check=True)
    job = out.stdout.strip().split(";")[0]
    while True:
        q = subprocess.run(["squeue", "-h", "-r", "-j", job, "-o", "%i"], env=cluster.env, capture_output=True,
                           text=True)
        if q.returncode == 0 and not q.stdout.strip():
            return time.perf_counter() - t0
        time.sleep(1.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--poll-interval", type=float, default=0.5)
    p.add_argument("--max-array", type=int, default=0, help="cap the array size below the cluster's MaxArraySize")
    p.add_argument("--raw", action="store_true", help="also time a plain sbatch --array of the same size")
    p.add_argument("--label", default="")
    a = p.parse_args()
    why = slurm_unavailable()
    if why:
        sys.exit(f"bench_slurm: {why}")
    cluster = start_cluster()
    try:
        warm_up(cluster)
        got = anyio.run(ours, cluster, a.n, a.poll_interval, a.max_array)
        raw_s = raw(cluster, a.n) if a.raw else None
    finally:
        cluster.cleanup()
    c = got["calls"]
    line = (f"slurm n={a.n}: ours {got['seconds']:.1f} s ({a.n / got['seconds']:.1f}/s; submit "
            f"{got['submit_seconds'] * 1000:.0f} ms), {got['completed']} completed; sbatch {c.get('sbatch', 0)}, "
            f"scontrol {c.get('scontrol', 0)}, squeue {c.get('squeue', 0)} over {got['ticks']} ticks "
            f"(max {got['max_per_tick']['squeue']}/tick, up to {got['max_runs_per_tick']} runs), sacct "
            f"{c.get('sacct', 0)}")
    if raw_s is not None:
        line += f"; raw array {raw_s:.1f} s; ours/raw {got['seconds'] / raw_s:.2f}"
    line += f"; peak RSS {peak_rss_mib():.0f} MiB"
    record("slurm", line, n=a.n, poll_interval=a.poll_interval, max_array=a.max_array, label=a.label,
           ours_s=round(got["seconds"], 2), submit_s=round(got["submit_seconds"], 3), completed=got["completed"],
           calls=c, ticks=got["ticks"], max_per_tick=got["max_per_tick"],
           raw_s=round(raw_s, 2) if raw_s is not None else None, peak_rss_mib=round(peak_rss_mib(), 1))


if __name__ == "__main__":
    main()
