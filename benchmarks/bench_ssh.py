"""Benchmark (d): ``ssh`` backend, 500 subjobs of ``/bin/true`` to two loopback hosts, against plain OpenSSH loops.

Two private sshds on 127.0.0.1 (``tests/support/sshd.py``: one port each,
own host keys, own ``authorized_keys``, a login user whose shell is
``/bin/sh``) are the two hosts. Both sides run the same N runs, spread
over the two hosts alike (run i on host i mod 2), alternately in the same
process:

* raw, sequential: a plain shell loop, ``ssh -i KEY -p PORT_(i mod 2) USER@127.0.0.1 /bin/true`` one after the
  other;
* raw, parallel: the same commands through ``xargs -P P`` (default P = 8);
* ours: one master of N subjobs of ``/bin/true`` on ``Backend("ssh", hosts=[both], ...)``,
  timed from ``await j.submit()`` to every subjob ``completed``, which
  includes the job wrapper on the remote side, and every run's output dir
  (``stdout``, ``stderr``, ``orch.log``) fetched back with SFTP.

Both raw loops check the host key against the same known_hosts file
(``StrictHostKeyChecking=yes``, ``BatchMode=yes``). The ratios are ours
over each raw loop (below 1: ours is faster); the speed-up is the plain
loop's time over ours (target: at least 5). The remote commands our driver
ran are reported from its ``calls`` counters, and how many runs each host
got.

    python benchmarks/bench_ssh.py [--n 500] [--hosts 2] [--slots 64] [--parallel 8] [--rounds 1]
        [--poll-interval 0.1] [--label TEXT]
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
from _common import peak_rss_mib, record, status_counts

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from sshd import SshEnv, sshd_unavailable, start_env  # noqa: E402

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator  # noqa: E402

EXE = "/bin/true"
TARGET_SPEEDUP = 5.0


def ssh_command(env: SshEnv, port: str) -> list[str]:
    """``ssh`` to one of the hosts (its port), running the job."""
    return ["ssh", "-i", str(env.client_key), "-p", port, "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={env.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "LogLevel=ERROR", f"{env.user}@127.0.0.1", EXE]


def ports(env: SshEnv, n: int) -> list[str]:
    """The host of each of the n runs: run i on host i mod (number of hosts)."""
    return [str(env.sshds[i % len(env.sshds)].port) for i in range(n)]


def raw_sequential(env: SshEnv, n: int) -> float:
    """A plain shell loop: one ``ssh`` after the other, each run to its host."""
    line = " ".join(shlex.quote(a) for a in ssh_command(env, "$port"))
    script = f"for port in {' '.join(ports(env, n))}; do {line.replace(shlex.quote('$port'), '$port')} || exit 1; done"
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", script], check=True)
    return time.perf_counter() - t0


def raw_parallel(env: SshEnv, n: int, parallel: int) -> float:
    """``xargs -P P``: P ``ssh`` processes at once, each run to its host."""
    cmd = ["xargs", "-P", str(parallel), "-I{}", *ssh_command(env, "{}")]
    t0 = time.perf_counter()
    subprocess.run(cmd, input="".join(f"{port}\n" for port in ports(env, n)).encode(), check=True)
    return time.perf_counter() - t0


async def ours(env: SshEnv, n: int, slots: int, poll: float) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="orch-bench-ssh-"))
    try:
        config = {"core": {"poll_interval": poll}}
        async with Orchestrator(home, config=config) as orch:
            j = await orch.jobs.add(Job(name="ssh-true", application=Executable(EXE),
                                        splitter=ArgSplitter([[] for _ in range(n)]),
                                        backend=Backend("ssh", **env.settings(slots=slots))))
            t0 = time.perf_counter()
            await j.submit(keep_going=True)
            t1 = time.perf_counter()
            await j.wait(timeout=600)
            t2 = time.perf_counter()
            counts = status_counts(orch, j)
            if counts != {"completed": n}:
                raise SystemExit(f"FAILED: master {j.status.value}, counts {counts}")
            missing = [s.fqid for s in j.subjobs if not (s.outputdir / "orch.log").exists()]
            if missing:
                raise SystemExit(f"FAILED: no orch.log fetched for {missing[:5]}")
            per_host = Counter(str(s.backend_id).partition("@")[2] for s in j.subjobs)  # key@user@host:port
            driver = (await orch.metrics())["backends"]["ssh"]["driver"]
            calls = {k: v for k, v in driver["calls"].items() if ":" not in k}
            ticks = driver["ticks"]
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return {"submit_s": t1 - t0, "total_s": t2 - t0, "calls": calls, "ticks": ticks, "per_host": dict(per_host)}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--hosts", type=int, default=2, help="loopback sshds, one port each (default 2)")
    p.add_argument("--slots", type=int, default=64, help="runs at once on the host (Backend slots)")
    p.add_argument("--parallel", type=int, default=8, help="xargs -P for the parallel raw loop")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--poll-interval", type=float, default=0.1)
    p.add_argument("--label", default="")
    a = p.parse_args()
    why = sshd_unavailable()
    if why:
        raise SystemExit(f"cannot run: {why}")
    env = start_env(a.hosts)
    try:
        seq, par, runs = [], [], []
        raw_parallel(env, 20, a.parallel)  # warm up: page cache, sshd's first forks
        for _ in range(a.rounds):
            seq.append(raw_sequential(env, a.n))
            par.append(raw_parallel(env, a.n, a.parallel))
            runs.append(anyio.run(ours, env, a.n, a.slots, a.poll_interval))
    finally:
        env.cleanup()
    seq_s, par_s = sum(seq) / a.rounds, sum(par) / a.rounds
    ours_s = sum(r["total_s"] for r in runs) / a.rounds
    calls = runs[-1]["calls"]
    speedup = seq_s / ours_s
    ok = speedup >= TARGET_SPEEDUP
    line = (f"bench_ssh: n={a.n} x{a.rounds} hosts={a.hosts} ours={ours_s:.2f}s ({a.n / ours_s:.0f}/s, slots={a.slots} "
            f"per host; runs per host {sorted(runs[-1]['per_host'].values())}) "
            f"raw ssh sequential={seq_s:.2f}s ({a.n / seq_s:.0f}/s) raw xargs -P{a.parallel}={par_s:.2f}s "
            f"({a.n / par_s:.0f}/s) ratio ours/sequential={ours_s / seq_s:.3f} ours/parallel={ours_s / par_s:.3f} "
            f"remote commands: submit={calls.get('submit', 0)} launch={calls.get('launch', 0)} "
            f"monitor={calls.get('monitor', 0)} over {runs[-1]['ticks']} ticks, sftp_get={calls.get('sftp_get', 0)}; "
            f"speed-up over the plain loop {speedup:.1f}x, target >= {TARGET_SPEEDUP:.0f}x: "
            f"{'MET' if ok else 'MISSED'}")
    record("bench_ssh", line, n=a.n, hosts=a.hosts, runs_per_host=runs[-1]["per_host"], rounds=a.rounds,
           slots=a.slots, parallel=a.parallel, speedup_sequential=round(speedup, 2), target_speedup=TARGET_SPEEDUP,
           met=ok, poll_interval=a.poll_interval, ours_s=[round(r["total_s"], 3) for r in runs],
           ours_submit_s=[round(r["submit_s"], 3) for r in runs], raw_sequential_s=[round(x, 3) for x in seq],
           raw_parallel_s=[round(x, 3) for x in par], ratio_sequential=round(ours_s / seq_s, 3),
           ratio_parallel=round(ours_s / par_s, 3), calls=calls, ticks=runs[-1]["ticks"],
           peak_rss_mib=round(peak_rss_mib(), 1), label=a.label)


if __name__ == "__main__":
    main()
