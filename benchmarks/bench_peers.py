"""Benchmark (j): N runs of ``/bin/true`` at concurrency 2 on this project and on its peers, interleaved.

The sides (``--sides``, comma-separated; default all of them):

* ``ours``: one master of N subjobs on ``local`` with ``max_running`` 2, the
  home's other settings the defaults (``bench_local_spawn.ours``: a fresh
  home, ``submit`` then ``wait``);
* ``raw``: ``asyncio.create_subprocess_exec`` N times, at most 2 at once
  (``bench_local_spawn.raw``): the floor of spawning from Python;
* ``xargs``: ``xargs -P 2 -n 1 /bin/true`` reading N lines;
* ``parsl-tp``: N Parsl ``bash_app``s on a ``ThreadPoolExecutor``
  (``max_threads`` 2; ``bench_vs_parsl.parsl_round``);
* ``parsl-htex``: the same on a ``HighThroughputExecutor``: one block on the
  ``LocalProvider``, ``max_workers_per_node`` 2;
* ``hq``: one HyperQueue job of N tasks on ``hyperqueue.cluster.LocalCluster``
  (its server and one worker of 2 cores run in this process), each task with
  HyperQueue's defaults (a stdout and a stderr file in the job's directory).

A round runs every side once, in turn (the order turns by one each round),
each in a Python process of its own: it sets the side up, runs ``--warmup``
runs untimed, then N timed from the first submission to the last completion
(ours and HyperQueue define their job before that). Measured per side:

* wall: that time;
* own CPU: the side's process (threads included), plus, for ours, the
  home's ``local`` launcher (``bench_local_spawn.launcher_usage``: started
  within the timed part, not a child of the side's process), for HTEX, its
  interchange and worker processes: every process other than the side's own
  that carries the round's marker in its environment and lives through the
  timed part, read in ``/proc/PID/stat`` before and after; for xargs, xargs;
* own system CPU: the part of own CPU the kernel spent on those processes'
  behalf (system calls, page faults): where a side's file system work shows;
* runs' CPU: what those processes' reaped children used (the runs, with the
  job wrapper, Parsl's ``/bin/sh -c`` or nothing between; ours: the runs the
  launcher reaped);
* peak RSS: the sum of those processes' peaks (``ru_maxrss``, ``VmHWM``); for
  xargs, the largest of xargs and its runs (``wait4``);
* entries per run: files and directories the side left in its directory
  (ours: the whole home; Parsl: its ``run_dir``; HyperQueue: its server and
  work directories; these two counted before and after the timed part), over
  N; ``—`` for raw and xargs, which have no directory.

Prints the medians over ``--rounds`` as a table and appends one line to
``results.jsonl``. After each side's process has ended, any process left
carrying its marker is named and killed. Linux only (``/proc``). Parsl and
HyperQueue come from the ``bench`` extra (``pip install -e ".[bench]"``).

    python benchmarks/bench_peers.py [--n 1000] [--rounds 3] [--warmup 20]
        [--sides ours,raw,xargs,parsl-tp,parsl-htex,hq] [--label TEXT]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import peak_of, proc_times, record
from bench_local_spawn import EXE, Meter, ours, raw
from bench_vs_parsl import parsl_round

SIDES = ("ours", "raw", "xargs", "parsl-tp", "parsl-htex", "hq")
CONCURRENCY = 2
MARK = "ORCH_BENCH_PEERS"
Result = dict[str, Any]  # floats; entries_per_run None where a side has no directory


# -- processes, read in /proc ------------------------------------------------------------------------------------

def marked(token: str, root: int | None = None) -> list[int]:
    """Live processes of a side: those whose environment has ``MARK=token``, and their and ``root``'s descendants.

    Not the environment alone: a process that sets its title (Parsl's interchange) may overwrite its own.
    """
    want, found, parent = f"{MARK}={token}".encode(), set(), {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
                if state != "Z":
                    parent[int(entry.name)] = int(ppid)
                    with open(f"/proc/{entry.name}/environ", "rb") as f:
                        if want in f.read().split(b"\0"):
                            found.add(int(entry.name))
            except OSError:
                pass
    tree = found | ({root} if root else set())
    while more := {pid for pid, ppid in parent.items() if ppid in tree and pid not in tree}:
        tree |= more
    return sorted(tree - {os.getpid()})


def entries(where: Path) -> int:
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(where))


# -- one side, in the side's own process -------------------------------------------------------------------------

def measure(n: int, phase: Callable[[], Result], where: Path | None = None) -> Result:
    """Run the timed part; add the CPU and peaks of the side's other processes to what the part measured itself."""
    token = os.environ[MARK]
    before = {pid: t for pid in marked(token, os.getpid()) if (t := proc_times(pid)) is not None}
    count0 = entries(where) if where else 0
    got = phase()  # total_s, cpu_self_s, cpu_self_sys_s, cpu_children_s, maybe rss_mib and entries
    own, sys_, kids, helpers = got["cpu_self_s"], got["cpu_self_sys_s"], got["cpu_children_s"], 0
    rss = got["rss_mib"] if "rss_mib" in got else peak_of(os.getpid())  # not ru_maxrss: see peak_of
    for pid, (user0, sys0, kuser0, ksys0) in before.items():
        if (now := proc_times(pid)) is not None:
            own += now[0] - user0 + now[1] - sys0
            sys_ += now[1] - sys0
            kids += now[2] - kuser0 + now[3] - ksys0
            rss, helpers = rss + peak_of(pid), helpers + 1
    made = got.get("entries", entries(where) - count0 if where else None)
    return {"wall_s": got["total_s"], "cpu_own_s": own, "cpu_own_sys_s": sys_, "cpu_runs_s": kids, "rss_mib": rss,
            "entries_per_run": None if made is None else made / n, "helpers": helpers}


def metered(work: Callable[[], object]) -> Result:
    with Meter() as m:
        work()
    return {"total_s": m.wall, "cpu_self_s": m.cpu_self, "cpu_self_sys_s": m.cpu_self_sys,
            "cpu_children_s": m.cpu_children}


def side_ours(n: int, warmup: int, scratch: Path) -> Result:
    config: dict[str, Any] = {"backends": {"local": {"max_running": CONCURRENCY}}}
    asyncio.run(ours(warmup, config, None))
    return measure(n, lambda: asyncio.run(ours(n, config, None)))


def side_raw(n: int, warmup: int, scratch: Path) -> Result:
    asyncio.run(raw(warmup, CONCURRENCY))
    return measure(n, lambda: asyncio.run(raw(n, CONCURRENCY)))


def xargs_round(n: int, scratch: Path) -> Result:
    """xargs's own CPU and its runs' read when it has ended but is not reaped; its peak RSS read while it runs."""
    feed = scratch / "feed"
    feed.write_bytes(b"x\n" * n)
    peak, done = [0.0], threading.Event()

    def watch(pid: int) -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], peak_of(pid))

    with open(feed, "rb") as stdin:
        t0 = time.perf_counter()
        proc = subprocess.Popen(["xargs", "-P", str(CONCURRENCY), "-n", "1", EXE], stdin=stdin)
        watcher = threading.Thread(target=watch, args=(proc.pid,))
        watcher.start()
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        wall = time.perf_counter() - t0
        done.set()
        watcher.join()
        times = proc_times(proc.pid)
        proc.wait()
    if proc.returncode != 0 or times is None:
        raise SystemExit(f"FAILED: xargs exited {proc.returncode}")
    return {"total_s": wall, "cpu_self_s": times[0] + times[1], "cpu_self_sys_s": times[1],
            "cpu_children_s": times[2] + times[3], "rss_mib": peak[0]}


def side_xargs(n: int, warmup: int, scratch: Path) -> Result:
    xargs_round(warmup, scratch)
    return measure(n, lambda: xargs_round(n, scratch))


def side_parsl(n: int, warmup: int, scratch: Path, htex: bool) -> Result:
    import parsl
    from parsl.config import Config
    from parsl.executors import HighThroughputExecutor, ThreadPoolExecutor
    from parsl.providers import LocalProvider

    # HTEX starts its interchange.py and process_worker_pool.py from PATH: this interpreter's scripts first
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    executor = (HighThroughputExecutor(max_workers_per_node=CONCURRENCY, address="127.0.0.1",
                                       provider=LocalProvider(init_blocks=1, min_blocks=1, max_blocks=1))
                if htex else ThreadPoolExecutor(max_threads=CONCURRENCY))
    dfk = parsl.load(Config(executors=[executor], run_dir=str(scratch), initialize_logging=False))
    try:
        true_app = parsl.bash_app(lambda exe=EXE: exe)  # HTEX sends it by value: no globals
        parsl_round(warmup, true_app)  # HTEX: its workers have connected
        return measure(n, lambda: parsl_round(n, true_app), scratch)
    finally:
        dfk.cleanup()


def side_hq(n: int, warmup: int, scratch: Path) -> Result:
    from hyperqueue import Job
    from hyperqueue.cluster import LocalCluster, WorkerConfig

    def job(k: int, work: Path) -> Job:  # a job of its own directory: its tasks' files are named by task id
        work.mkdir()
        j = Job(default_workdir=work)
        for _ in range(k):
            j.program([EXE])
        return j

    with LocalCluster(server_dir=str(scratch / "server"), worker_config=WorkerConfig(cores=CONCURRENCY)) as cluster:
        client = cluster.client()
        metered(lambda: client.wait_for_jobs([client.submit(job(warmup, scratch / "warmup"))]))
        timed, t0 = job(n, scratch / "work"), time.time()
        result = measure(n, lambda: metered(lambda: client.wait_for_jobs([client.submit(timed)])), scratch)
    # Its client learns of the end by asking once a second: when did the last task start (its files' newest)?
    result["hq_last_start_s"] = max(e.stat().st_mtime for e in os.scandir(scratch / "work")) - t0
    return result


def child(side: str, n: int, warmup: int) -> None:
    scratch = Path(tempfile.mkdtemp(prefix=f"orch-bench-peers-{side}-"))
    try:
        if side.startswith("parsl-"):
            result = side_parsl(n, warmup, scratch, htex=side == "parsl-htex")
        else:
            result = {"ours": side_ours, "raw": side_raw, "xargs": side_xargs, "hq": side_hq}[side](n, warmup, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(result), flush=True)


# -- the rounds, in the parent -----------------------------------------------------------------------------------

def run_side(side: str, a: argparse.Namespace) -> Result:
    """One side's round in a process of its own; then kill whatever it left running."""
    token = uuid.uuid4().hex
    cmd = [sys.executable, __file__, "--child", side, "--n", str(a.n), "--warmup", str(a.warmup)]
    try:
        proc = subprocess.run(cmd, env={**os.environ, MARK: token}, capture_output=True, text=True,
                              timeout=300 + a.n * 0.05)
    finally:
        left = marked(token)
        for pid in left:
            print(f"  {side} left pid {pid} running ({_cmdline(pid)}): killed", file=sys.stderr, flush=True)
            os.kill(pid, signal.SIGKILL)
    if proc.returncode != 0:
        raise SystemExit(f"FAILED: side {side} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    result: Result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["left_running"] = len(left)
    return result


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


def table(sides: list[str], med: dict[str, dict[str, float | None]], n: int) -> str:
    head = ("side", "wall s", "runs/s", "own CPU s", "runs CPU s", "own ms/run", "of it sys", "peak RSS MiB",
            "entries/run")
    rows = [head]
    for s in sides:
        m = med[s]
        wall, own, sys_, kids, rss, ent = (m["wall_s"], m["cpu_own_s"], m["cpu_own_sys_s"], m["cpu_runs_s"],
                                           m["rss_mib"], m["entries_per_run"])
        assert wall is not None and own is not None and kids is not None and rss is not None and sys_ is not None
        rows.append((s, f"{wall:.2f}", f"{n / wall:.0f}", f"{own:.2f}", f"{kids:.2f}", f"{own * 1000 / n:.2f}",
                     f"{sys_ * 1000 / n:.2f}", f"{rss:.0f}", "—" if ent is None else f"{ent:.2f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=20, help="untimed runs in each side's process first")
    p.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {', '.join(SIDES)}")
    p.add_argument("--label", default="")
    p.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a.child, a.n, a.warmup)
    sides = [s.strip() for s in a.sides.split(",") if s.strip()]
    if unknown := [s for s in sides if s not in SIDES]:
        p.error(f"unknown sides {unknown}; known: {', '.join(SIDES)}")
    rounds: dict[str, list[Result]] = {s: [] for s in sides}
    for r in range(a.rounds):
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        for side in order:
            rounds[side].append(run_side(side, a))
        print(f"  round {r + 1}: " + ", ".join(f"{s} {rounds[s][-1]['wall_s']:.2f} s" for s in order), flush=True)
    keys = ("wall_s", "cpu_own_s", "cpu_own_sys_s", "cpu_runs_s", "rss_mib", "entries_per_run")
    med: dict[str, dict[str, float | None]] = {
        s: {k: None if got[0][k] is None else round(statistics.median(x[k] for x in got), 4) for k in keys}
        for s, got in rounds.items()}
    print(f"N={a.n} runs of {EXE}, concurrency {CONCURRENCY}, medians of {a.rounds} round(s):")
    print(table(sides, med, a.n), flush=True)
    if "hq" in rounds:
        med["hq"]["last_start_s"] = round(statistics.median(x["hq_last_start_s"] for x in rounds["hq"]), 4)
        print(f"hq: its client learns of the end by asking once a second; its last task started at "
              f"{med['hq']['last_start_s']:.2f} s", flush=True)
    line = (f"bench_peers: n={a.n} x{a.rounds} medians wall/own CPU/runs CPU: "
            + ", ".join(f"{s} {m['wall_s']:.2f}/{m['cpu_own_s']:.2f}/{m['cpu_runs_s']:.2f}s" for s, m in med.items()))
    record("bench_peers", line, n=a.n, rounds=a.rounds, warmup=a.warmup, concurrency=CONCURRENCY, sides=sides,
           medians=med, per_round={s: [{k: v if v is None else round(v, 4) for k, v in x.items()} for x in got]
                                   for s, got in rounds.items()},
           versions={k: _version(k) for k in ("parsl", "hyperqueue")}, home_root=tempfile.gettempdir(),
           label=a.label)


if __name__ == "__main__":
    main()
