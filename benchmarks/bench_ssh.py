"""Benchmark (d): ``ssh`` backend, 500 subjobs of ``/bin/true`` to loopback, against plain OpenSSH loops.

A private sshd on 127.0.0.1 (``tests/support/sshd.py``: own host key, own
``authorized_keys``, a login user whose shell is ``/bin/sh``) serves both
sides, which run alternately in the same process:

* raw, sequential: ``for i in $(seq N); do ssh -i KEY -p PORT USER@127.0.0.1 /bin/true; done``;
* raw, parallel: ``seq N | xargs -P P -I{} ssh ... /bin/true`` (default P = 8);
* ours: one master of N subjobs of ``/bin/true`` on ``Backend("ssh", ...)``,
  timed from ``await j.submit()`` to every subjob ``completed``, which
  includes the job wrapper on the remote side, and every run's output dir
  (``stdout``, ``stderr``, ``orch.log``) fetched back with SFTP.

Both raw loops check the host key against the same known_hosts file
(``StrictHostKeyChecking=yes``, ``BatchMode=yes``). The ratios are ours
over each raw loop (below 1: ours is faster). The remote commands our
driver ran are reported from its ``calls`` counters.

    python benchmarks/bench_ssh.py [--n 500] [--slots 64] [--parallel 8] [--rounds 1] [--poll-interval 0.1]
        [--label TEXT]
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from _common import peak_rss_mib, record, status_counts

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from sshd import SshEnv, sshd_unavailable, start_env  # noqa: E402

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator  # noqa: E402

EXE = "/bin/true"


def ssh_command(env: SshEnv) -> list[str]:
    sshd = env.sshds[0]
    return ["ssh", "-i", str(env.client_key), "-p", str(sshd.port), "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={env.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "LogLevel=ERROR", f"{env.user}@127.0.0.1", EXE]


def raw_sequential(env: SshEnv, n: int) -> float:
    """A plain shell loop: one ``ssh`` after the other."""
    line = " ".join(shlex.quote(a) for a in ssh_command(env))
    script = f"i=0; while [ $i -lt {n} ]; do {line} || exit 1; i=$((i + 1)); done"
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", script], check=True)
    return time.perf_counter() - t0


def raw_parallel(env: SshEnv, n: int, parallel: int) -> float:
    """``seq N | xargs -P P``: P ``ssh`` processes at once."""
    cmd = ["xargs", "-P", str(parallel), "-I{}", *ssh_command(env)]
    t0 = time.perf_counter()
    subprocess.run(cmd, input="".join(f"{i}\n" for i in range(n)).encode(), check=True)
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
            driver = (await orch.metrics())["backends"]["ssh"]["driver"]
            calls = {k: v for k, v in driver["calls"].items() if ":" not in k}
            ticks = driver["ticks"]
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return {"submit_s": t1 - t0, "total_s": t2 - t0, "calls": calls, "ticks": ticks}


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--n", type=int, default=500)
    p.add_argument("--slots", type=int, default=64, help="runs at once on the host (Backend slots)")
    p.add_argument("--parallel", type=int, default=8, help="xargs -P for the parallel raw loop")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--poll-interval", type=float, default=0.1)
    p.add_argument("--label", default="")
    a = p.parse_args()
    why = sshd_unavailable()
    if why:
        raise SystemExit(f"cannot run: {why}")
    env = start_env(1)
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
    line = (f"bench_ssh: n={a.n} x{a.rounds} ours={ours_s:.2f}s ({a.n / ours_s:.0f}/s, slots={a.slots}) "
            f"raw ssh sequential={seq_s:.2f}s ({a.n / seq_s:.0f}/s) raw xargs -P{a.parallel}={par_s:.2f}s "
            f"({a.n / par_s:.0f}/s) ratio ours/sequential={ours_s / seq_s:.3f} ours/parallel={ours_s / par_s:.3f} "
            f"remote commands: submit={calls.get('submit', 0)} launch={calls.get('launch', 0)} "
            f"monitor={calls.get('monitor', 0)} over {runs[-1]['ticks']} ticks, sftp_get={calls.get('sftp_get', 0)}")
    record("bench_ssh", line, n=a.n, rounds=a.rounds, slots=a.slots, parallel=a.parallel,
           poll_interval=a.poll_interval, ours_s=[round(r["total_s"], 3) for r in runs],
           ours_submit_s=[round(r["submit_s"], 3) for r in runs], raw_sequential_s=[round(x, 3) for x in seq],
           raw_parallel_s=[round(x, 3) for x in par], ratio_sequential=round(ours_s / seq_s, 3),
           ratio_parallel=round(ours_s / par_s, 3), calls=calls, ticks=runs[-1]["ticks"],
           peak_rss_mib=round(peak_rss_mib(), 1), label=a.label)


if __name__ == "__main__":
    main()
