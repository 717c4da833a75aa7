"""Benchmark (i): one master of 100,000 ``sim`` subjobs on PostgreSQL against SQLite, in one run, as a ratio.

The same work as (a) (``bench_sim_100k.py``), once per repository, in
alternating rounds: the home's SQLite file (the default), and a PostgreSQL
database (``[repository] url``) of a private server this script starts
(``tests/support/postgres.py``: initdb into a temporary directory, its own
socket and port, the server's durable defaults: fsync and synchronous
commit on). Each round measures, from ``await j.submit()`` to every subjob
``completed`` and persisted (closing the orchestrator writes what is still
in memory; then the stored statuses are counted with the runtime's own
loader), the wall time, split into submit and monitoring-to-completion,
and then the time to open the home again (``Orchestrator(home)``: loading
100,000 subjobs). The ratio is PostgreSQL's median total over SQLite's.
Target: at most 2.

Then where the time goes, at the repository itself (each write one
transaction, as the runtime makes them): storing the split (100,000 subjob
rows), a flush that records 100,000 backend ids with the run arrays, a
flush of the run arrays alone (a tick of status changes), loading the home,
and reading every delta back (the synchronous look-up a bulk submission
makes).

    python benchmarks/bench_repository.py [--n 100000] [--rounds 2] [--root /tmp/bench] [--label TEXT]
        [--profile DIR]   (a cProfile of each round's submit..persisted, DIR/<repository>-<round>.prof)
"""

from __future__ import annotations

import argparse
import cProfile
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from _common import peak_rss_mib, record

from orchestrator import ArgSplitter, Backend, Executable, Job, JobStatus, Orchestrator
from orchestrator.runtime.config import Config
from orchestrator.runtime.repository import Repository, RunsRow, Save, TopRow
from orchestrator.runtime.storage import Storage

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from postgres import PostgresServer, postgres_unavailable  # noqa: E402

TARGET_RATIO = 2.0


async def stored_completed(home: Path, master: int) -> int:
    """Completed subjobs of ``master`` as the repository stores them (read back with the runtime's loader)."""
    storage = Storage.of(home, Config.load(home).section("repository"))
    repo = storage.repository()
    await repo.open(readonly=storage.shared)
    try:
        loaded = await repo.load()
    finally:
        await repo.close()
    return loaded.runs[master].status.count(JobStatus.COMPLETED.code)


async def one_round(home: Path, n: int, profile: cProfile.Profile | None) -> dict[str, float]:
    async with Orchestrator(home) as orch:
        args = [[str(i)] for i in range(n)]
        j = await orch.jobs.add(Job(name="bench-repository", application=Executable("/bin/true"),
                                    splitter=ArgSplitter(args), backend=Backend("sim", run_seconds=0)))
        del args
        if profile is not None:
            profile.enable()
        t0 = time.perf_counter()
        await j.submit()
        t1 = time.perf_counter()
        await j.wait(timeout=600)
        status, job = j.status.value, j.id
    assert job is not None  # added above
    done = await stored_completed(home, job)  # closed above: everything is written
    t2 = time.perf_counter()
    if profile is not None:
        profile.disable()
    if done != n or status != "completed":
        raise SystemExit(f"FAILED in {home}: master {status}, {done} of {n} completed in the repository")
    t3 = time.perf_counter()
    async with Orchestrator(home) as orch:
        assert len(orch.jobs[job].subjobs) == n
        t4 = time.perf_counter()
    return {"submit_s": t1 - t0, "complete_s": t2 - t1, "total_s": t2 - t0, "open_s": t4 - t3}


async def parts(home: Path, n: int) -> dict[str, float]:
    """Seconds of each kind of write and read, at the repository alone (see the module docstring)."""
    repo: Repository = Storage.of(home, Config.load(home).section("repository")).repository()
    await repo.open()
    try:
        spec = {"application": {"exe": "/bin/true"}, "backend": {"name": "sim"}, "splitter": {"plugin": "args"}}
        zeros = {k: bytes(8 * n) for k in ("submitting", "submitted", "running", "final")}
        top = TopRow(0, "parts", "new", spec, None, {"top": {}}, 0, 1.0)
        await repo.add_job(top, RunsRow(0, bytes(1), bytes(4), {k: bytes(8) for k in zeros}))
        runs = RunsRow(0, bytes([1]) * n, bytes(4 * n), zeros)
        top.spec, top.n_subjobs = None, n
        out = {}
        t = time.perf_counter()
        await repo.store_split(top, runs, (f'{{"application.args":["{i}"]}}' for i in range(n)))
        out["store_split_s"] = time.perf_counter() - t
        t = time.perf_counter()
        await repo.save(Save(tops=[top], runs=[runs], backend_ids=[(0, i, f"sim:0.{i}:1:0:0:completed")
                                                                   for i in range(n)]))
        out["save_ids_s"] = time.perf_counter() - t
        t = time.perf_counter()
        await repo.save(Save(tops=[top], runs=[RunsRow(0, bytes([2]) * n, bytes(4 * n), zeros)]))
        out["save_runs_s"] = time.perf_counter() - t
        t = time.perf_counter()
        await repo.load()
        out["load_s"] = time.perf_counter() - t
        t = time.perf_counter()
        assert len(repo.all_deltas(0)) == n
        out["all_deltas_s"] = time.perf_counter() - t
        return out
    finally:
        await repo.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=2, help="rounds per repository, alternating (default 2)")
    p.add_argument("--root", default="/tmp/bench", help="where the homes go (wiped)")
    p.add_argument("--profile", metavar="DIR", help="write a cProfile of each round into DIR")
    p.add_argument("--label", default="", help="free text stored with the result")
    a = p.parse_args()
    why = postgres_unavailable()
    if why is not None:
        raise SystemExit(f"bench_repository: {why}")
    server = PostgresServer(durable=True).start()
    results: dict[str, list[dict[str, float]]] = {"sqlite": [], "postgresql": []}
    try:
        for r in range(a.rounds):
            for kind in ("sqlite", "postgresql"):
                home = Path(a.root) / f"repository-{kind}"
                shutil.rmtree(home, ignore_errors=True)
                home.mkdir(parents=True)
                if kind == "postgresql":
                    (home / "orchestrator.toml").write_text(f"[repository]\nurl = {server.database()!r}\n")
                profile = cProfile.Profile() if a.profile else None
                got = anyio.run(one_round, home, a.n, profile)
                if profile is not None:
                    Path(a.profile).mkdir(parents=True, exist_ok=True)
                    profile.dump_stats(str(Path(a.profile) / f"{kind}-{r}.prof"))
                print(f"  round {r + 1} {kind}: " + " ".join(f"{k}={v:.2f}" for k, v in got.items()), flush=True)
                results[kind].append(got)
        pieces = {}
        for kind in ("sqlite", "postgresql"):
            home = Path(a.root) / f"repository-parts-{kind}"
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir(parents=True)
            if kind == "postgresql":
                (home / "orchestrator.toml").write_text(f"[repository]\nurl = {server.database()!r}\n")
            pieces[kind] = {k: round(v, 3) for k, v in anyio.run(parts, home, a.n).items()}
            print(f"  parts {kind}: " + " ".join(f"{k}={v:.3f}" for k, v in pieces[kind].items()), flush=True)
    finally:
        server.stop()
    med: dict[str, dict[str, float]] = {k: {m: statistics.median(x[m] for x in v) for m in v[0]}
                                        for k, v in results.items()}
    ratio = med["postgresql"]["total_s"] / med["sqlite"]["total_s"]
    rss = peak_rss_mib()
    ok = ratio <= TARGET_RATIO
    line = (f"bench_repository: n={a.n} rounds={a.rounds} sqlite total={med['sqlite']['total_s']:.2f}s "
            f"(submit {med['sqlite']['submit_s']:.2f}s + complete {med['sqlite']['complete_s']:.2f}s, reopen "
            f"{med['sqlite']['open_s']:.2f}s) postgresql total={med['postgresql']['total_s']:.2f}s (submit "
            f"{med['postgresql']['submit_s']:.2f}s + complete {med['postgresql']['complete_s']:.2f}s, reopen "
            f"{med['postgresql']['open_s']:.2f}s) ratio={ratio:.2f} target <={TARGET_RATIO:g}: "
            f"{'MET' if ok else 'MISSED'}{' [profiled]' if a.profile else ''}")
    rounded: dict[str, Any] = {k: {m: round(v, 3) for m, v in d.items()} for k, d in med.items()}
    record("bench_repository", line, n=a.n, rounds=a.rounds, medians=rounded,
           times={k: [round(x["total_s"], 3) for x in v] for k, v in results.items()}, ratio=round(ratio, 3),
           target_ratio=TARGET_RATIO, met=ok, parts=pieces, peak_rss_mib=round(rss, 1), postgresql_durable=True,
           profiled=bool(a.profile), label=a.label)


if __name__ == "__main__":
    main()
