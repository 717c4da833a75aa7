"""The ``slurm`` backend against a real one-node Slurm cluster on loopback (see ``tests/support/slurmd.py``).

Acceptance tests of issue 4 (Slurm half): 3. a 50-subjob job goes in with
one ``sbatch --array`` and completes; killing one subjob cancels its array
task only; resubmitting it runs it again, as a job of its own; 4. a run over
its time limit and a run exiting non-zero are classified per docs/design.md's
table and retried within the job's limits; 5. monitoring costs one
``squeue`` per tick whatever the number of subjobs. Plus: per-subjob
resources make one array per group, a cancellation outside the orchestrator
holds the run, and a reopened home finds runs that went on without it.

The cluster has 2 CPUs and a trivial task takes a few tenths of a second, so
the jobs are small; the time-limit test waits for Slurm, whose limits are
whole minutes, checked every 30 s (the run is killed 60-90 s after it starts).
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from slurmd import SlurmCluster, slurm_cluster  # noqa: F401 - the session fixture, used by name

from orchestrator import ArgSplitter, Backend, Executable, GenericSplitter, Job, Orchestrator, RetryPolicy

pytestmark = pytest.mark.anyio
CONFIG = {"core": {"poll_interval": 0.25}}


async def slurm_driver(orch: Orchestrator) -> SimpleNamespace:
    """The slurm driver's metrics: Slurm commands run by name, the last ones, and each monitoring tick's."""
    m = (await orch.metrics())["backends"]["slurm"]["driver"]
    return SimpleNamespace(calls=Counter(m["calls"]), history=[tuple(h) for h in m["history"]], ticks=m["ticks"],
                           tick_calls=m["tick_calls"], tick_runs=m["tick_runs"])


def last_of(d: SimpleNamespace, command: str) -> tuple[str, ...]:
    """The newest call of ``command`` (the monitor's polls may have come after it)."""
    return next(c for c in reversed(d.history) if c[0] == command)


def backend(cluster: SlurmCluster, **settings: object) -> Backend:
    return Backend("slurm", slurm_conf=str(cluster.conf), **settings)


def sh_job(script: str, n: int, be: Backend, **kw: Any) -> Job:
    """``n`` subjobs of ``sh -c script i`` (``$0`` is the index)."""
    return Job(name="slurm", application=Executable("/bin/sh", args=["-c", script, "-"]),
               splitter=ArgSplitter([["-c", script, str(i)] for i in range(n)]), backend=be, **kw)


def squeue(cluster: SlurmCluster, job: str, fmt: str = "%K|%T") -> dict[str, str]:
    """What Slurm itself says about each task of an array: task -> field."""
    out = subprocess.run(["squeue", "-h", "-r", "--states=all", "-j", job, "-o", fmt], env=cluster.env,
                         capture_output=True, text=True, check=True).stdout
    return dict(line.split("|", 1) for line in out.split())


def states(j: Job) -> list[tuple[str, str, str | None]]:
    return [(s.fqid, s.status.value, s.info.reason) for s in j.subjobs]


# --------------------------------------------------------------------------- 3
async def test_fifty_subjobs_one_array_kill_one_task_resubmit_it(slurm_cluster: SlurmCluster,  # noqa: F811
                                                                 tmp_path: Path) -> None:
    n = 50
    async with Orchestrator(home=tmp_path, config=CONFIG) as orch:
        j = await orch.jobs.add(sh_job('echo "out $0"', n, backend(slurm_cluster)))
        await j.submit()
        assert (await slurm_driver(orch)).calls["sbatch"] == 1  # the whole master went in at once
        sbatch = last_of(await slurm_driver(orch), "sbatch")
        assert sbatch[0] == "sbatch" and f"--array=0-{n - 1}" in sbatch
        array = str(j.subjobs[0].backend_id).split("_")[0]
        assert [s.backend_id for s in j.subjobs] == [f"{array}_{i}" for i in range(n)]

        victim = j.subjobs[n - 1]  # the last task: still pending while the first ones run
        await victim.kill()
        assert victim.status == "killed"
        d = await slurm_driver(orch)
        assert d.calls["scancel"] == 1 and last_of(d, "scancel") == ("scancel", f"{array}_{n - 1}")
        await j.wait(timeout=90)
        assert [s.status.value for s in j.subjobs] == ["completed"] * (n - 1) + ["killed"], states(j)
        assert j.status == "completed"
        assert all((s.outputdir / "stdout").read_text() == f"out {i}\n" for i, s in enumerate(j.subjobs[:n - 1]))
        assert not (victim.outputdir / "orch.log").exists()  # it never started
        seen = squeue(slurm_cluster, array)  # Slurm's own word: no sibling was cancelled
        assert {t for t, state in seen.items() if state != "COMPLETED"} <= {str(n - 1)}
        assert all(seen[str(i)] == "COMPLETED" for i in range(n - 1))

        await victim.resubmit()
        assert (await slurm_driver(orch)).calls["sbatch"] == 2
        again = last_of(await slurm_driver(orch), "sbatch")
        assert again[0] == "sbatch" and not any(a.startswith("--array") for a in again)  # a job of its own
        assert str(victim.backend_id).isdigit()
        await j.wait(timeout=60)
        assert victim.status == "completed" and victim.info.submit_counter == 2
        assert (victim.outputdir / "stdout").read_text() == f"out {n - 1}\n"
        assert j.status == "completed"
        d = await slurm_driver(orch)
        assert d.calls["sacct"] == 0  # every end was seen in squeue (ended jobs stay for MinJobAge)


# --------------------------------------------------------------------------- 4
async def test_time_limit_and_nonzero_exit_are_classified_and_retried(slurm_cluster: SlurmCluster,  # noqa: F811
                                                                     tmp_path: Path) -> None:
    slow = 'if [ "$ORCH_RETRY_COUNT" = 0 ]; then sleep 300; fi; echo "ok $ORCH_RETRY_COUNT"'  # only the 1st is slow
    bad = "echo bad; exit 3"
    job = Job(name="limits", application=Executable("/bin/sh", args=["-c", slow]),
              splitter=ArgSplitter([["-c", slow], ["-c", bad]]),
              backend=backend(slurm_cluster, time=1),  # one minute: Slurm's smallest limit
              retry=RetryPolicy(max_early=1, max_late_handled=0, max_late_unhandled=0, early_seconds=20))
    async with Orchestrator(home=tmp_path, config=CONFIG) as orch:
        j = await orch.jobs.add(job)
        await j.submit()
        last = last_of(await slurm_driver(orch), "sbatch")
        assert "--time=1" in last and "--array=0-1" in last
        await j.wait(timeout=170)
        timed_out, failing = j.subjobs[0], j.subjobs[1]

        # Over its time limit: Slurm killed the wrapper after START and before END -> worker level, late
        # unhandled. The action table's rule "slurm-time-limit" retried it with twice the time, although the
        # job allows no late unhandled retry (max_late_unhandled=0): the infrastructure's fault is not the user's.
        assert timed_out.status == "completed", states(j)
        assert timed_out.info.submit_counter == 2
        [entry] = timed_out.info.history
        assert (entry["level"], entry["verdict"], entry["action"]) == ("worker", "late_unhandled", "retry")
        assert entry["rule"] == "slurm-time-limit" and entry["change"].startswith("time x2")
        assert "TIMEOUT" in entry["reason"]
        assert timed_out.info.counters == {"rule:slurm-time-limit": 1}  # the user's late_unhandled untouched
        assert any("--time=2" in call for call in (await slurm_driver(orch)).history)
        assert (timed_out.outputdir / "stdout").read_text() == "ok 1\n"

        # Exit 3 without a keyword -> application level, early: no rule matches; retried once (max_early=1).
        assert failing.status == "failed"
        assert failing.info.submit_counter == 2
        first, second = failing.info.history
        assert (first["level"], first["verdict"], first["action"]) == ("application", "early", "retry")
        assert (second["level"], second["verdict"], second["limit"]) == ("application", "early", "max_early")
        assert first["exit_code"] == 3 and "max_early=1 reached" in str(failing.info.reason)
        assert "rule" not in first
        assert j.status == "failed"
        assert (await slurm_driver(orch)).calls["sbatch"] == 3  # the array of two, then each retry as a job of its own
    async with Orchestrator(home=tmp_path, config=CONFIG) as orch:  # the subjob's new limit is stored as its own
        assert orch.jobs[0].subjobs[0].backend.settings["time"] == "2"
        assert orch.jobs[0].subjobs[1].backend.settings["time"] == "1"


async def test_out_of_memory_is_retried_with_more_memory(slurm_cluster: SlurmCluster,  # noqa: F811
                                                         tmp_path: Path) -> None:
    """Over its --mem, Slurm kills the run (OUT_OF_MEMORY, enforced by the accounting poller here, where the
    test cluster has no cgroups); the rule "slurm-out-of-memory" retries it with twice the memory until it fits,
    and no retry limit of the job is used (they are all 0)."""
    hog = 'import time; x = b"x" * (300 << 20); time.sleep(4); print("fits", len(x) >> 20)'
    job = Job(name="hog", application=Executable("/usr/bin/python3", args=["-c", hog]),
              backend=backend(slurm_cluster, mem=100, time=5))
    async with Orchestrator(home=tmp_path, config=CONFIG) as orch:
        j = await orch.jobs.add(job)
        await j.submit()
        await j.wait(timeout=120)
        assert j.status == "completed", j.info.history
        assert [(h["rule"], h["action"]) for h in j.info.history] == [("slurm-out-of-memory", "retry")] * 2
        assert all("OUT_OF_MEMORY" in h["reason"] for h in j.info.history)
        assert j.info.submit_counter == 3
        mems = [a for call in (await slurm_driver(orch)).history for a in call if a.startswith("--mem=")]
        assert mems[-3:] == ["--mem=100", "--mem=200M", "--mem=400M"]
        assert (j.outputdir / "stdout").read_text() == "fits 300\n"
        assert j.info.counters == {"rule:slurm-out-of-memory": 2}
    async with Orchestrator(home=tmp_path, config=CONFIG) as orch:  # the new settings are the job's, stored
        assert orch.jobs[0].backend.settings["mem"] == "400M"


# --------------------------------------------------------------------------- 5
async def test_one_squeue_per_tick_and_one_array_per_resource_group(slurm_cluster: SlurmCluster,  # noqa: F811
                                                                   tmp_path: Path) -> None:
    n = 30
    script = "sleep 0.2"
    splitter = GenericSplitter(multi_attrs={"application.args": [["-c", script, str(i)] for i in range(n)],
                                            "backend.time": [10 if i % 2 else 20 for i in range(n)]})
    job = Job(name="ticks", application=Executable("/bin/sh", args=["-c", script]), splitter=splitter,
              backend=backend(slurm_cluster))
    async with Orchestrator(home=tmp_path, config=CONFIG) as orch:
        j = await orch.jobs.add(job)
        await j.submit()
        d = await slurm_driver(orch)
        sbatches = [argv for argv in d.history if argv[0] == "sbatch"]
        assert len(sbatches) == 2 == d.calls["sbatch"]  # one array per group of equal resources
        assert {a for argv in sbatches for a in argv if a.startswith(("--time", "--array"))} == {
            "--time=10", "--time=20", f"--array=0-{n // 2 - 1}"}
        limits = {s.backend_id: s.backend.settings["time"] for s in j.subjobs}
        for array in {str(b).split("_")[0] for b in limits}:
            told = squeue(slurm_cluster, array, "%K|%l")
            assert {told[str(b).split("_")[1]] for b in limits if str(b).startswith(f"{array}_")} in (
                {"10:00"}, {"20:00"})
        await j.wait(timeout=90)
        assert j.status == "completed", states(j)
        d = await slurm_driver(orch)
        ticks, runs = list(d.tick_calls), list(d.tick_runs)
        assert len(ticks) == d.ticks == d.calls["squeue"] >= 5
        assert all(tick == {"squeue": 1} for tick in ticks)  # one squeue, whatever the number of runs it covered
        assert max(runs) == n and len(set(runs)) >= 3


# ----------------------------------------------------------------------- more
async def test_cancelled_outside_the_orchestrator_is_held(slurm_cluster: SlurmCluster,  # noqa: F811
                                                          tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path, config=CONFIG) as orch:
        j = await orch.jobs.add(Job(name="held", application=Executable("/bin/sleep", args=["60"]),
                                    backend=backend(slurm_cluster)))
        await j.submit()
        with anyio.fail_after(30):
            while j.status != "running":
                await anyio.sleep(0.1)
        subprocess.run(["scancel", str(j.backend_id)], env=slurm_cluster.env, check=True)  # an administrator
        await j.wait(timeout=30)
        assert j.status == "held"
        [entry] = j.info.history
        assert (entry["level"], entry["verdict"]) == ("backend", "hold") and "CANCELLED" in entry["reason"]
        await j.kill()
        assert j.status == "killed"


async def test_reopened_home_finds_runs_that_went_on_without_it(slurm_cluster: SlurmCluster,  # noqa: F811
                                                                tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path, config=CONFIG) as orch:
        j = await orch.jobs.add(sh_job('sleep 1; echo "done $0"', 4, backend(slurm_cluster)))
        await j.submit()
        job_id = j.id
    await anyio.sleep(1)
    async with Orchestrator(home=tmp_path, config=CONFIG) as orch:
        j = orch.jobs(job_id)
        await j.wait(timeout=60)
        assert j.status == "completed", states(j)
        assert all((s.outputdir / "stdout").read_text() == f"done {i}\n" for i, s in enumerate(j.subjobs))
        assert (await slurm_driver(orch)).calls["sbatch"] == 0  # nothing went in again
