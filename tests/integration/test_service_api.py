"""The Python API through a running service: ``async with Orchestrator(home)`` while ``orchestrator serve``
holds the home works through it (the remote transport) with the embedded API's surface, statuses and errors.

Each test runs a real ``orchestrator serve`` subprocess, stopped by its PID at teardown.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from served import Service

from orchestrator import (
    ArgSplitter,
    Backend,
    Executable,
    HomeLockedError,
    Job,
    JobError,
    JobStatus,
    Orchestrator,
    OrchestratorError,
    RetryPolicy,
)
from orchestrator.api.client import ServiceClient, ServiceUnavailable

pytestmark = pytest.mark.anyio

NO_RETRY = RetryPolicy(max_early=0, max_late_handled=0, max_late_unhandled=0)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Service]:
    service = Service(tmp_path / "home").start()
    try:
        yield service
    finally:
        service.stop()


def sim_job(n: int, name: str = "scan", **settings: Any) -> Job:
    return Job(name=name, application=Executable("/bin/true"), splitter=ArgSplitter([[str(i)] for i in range(n)]),
               backend=Backend("sim", **settings), retry=NO_RETRY)


# ------------------------------------------------------------------ docs/design.md's example
async def test_the_design_example_through_the_service(served: Service) -> None:
    home = served.home
    async with Orchestrator(home=home) as orch:
        assert orch.remote and orch.home == home.resolve()
        j = await orch.jobs.add(Job(name="scan", application=Executable("/bin/echo", args=["x"]),
                                    splitter=ArgSplitter([["a"], ["b"], ["c"]]), backend="local"))
        assert j.subjobs == [] and j.parent is None and j.status == "new"
        await j.submit(keep_going=True)
        await j.wait(timeout=60)
        assert orch.jobs(j.id) is j and orch.jobs[j.id] is j
        assert orch.jobs((j.id, 1)) is j.subjobs[1] and orch.jobs(f"{j.id}.1") is j.subjobs[1]
        assert orch.jobs[j.id, 1] is j.subjobs[1]
        assert j.subjobs(2) is j.subjobs[2] and j.subjobs[2].fqid == f"{j.id}.2"
        assert j.subjobs[2].parent is j and j.subjobs[-1] is j.subjobs[2]
        assert j.status == JobStatus.COMPLETED and isinstance(j.status, JobStatus)
        assert [s.status for s in j.subjobs] == ["completed"] * 3 and not j.is_active()
        for i, word in enumerate("abc"):
            sub = j.subjobs[i]
            assert sub.outputdir == home / "workspace" / str(j.id) / str(i) / "output"
            assert (sub.outputdir / "stdout").read_text() == f"{word}\n"
            assert sub.info.submit_counter == 1 and sub.backend_id and sub.backend.name == "local"
            assert sub.application is not None and sub.application.args == [word]
        assert j.inputdir == home / "workspace" / str(j.id) / "input"
        assert j.name == "scan" and j.backend == "local" and j.info.submit_counter == 1
        failed = j.subjobs.select(status="failed")
        assert len(failed) == 0
        await failed.resubmit()
        assert len(orch.jobs) == 1 and list(orch.jobs) == [j]


async def test_sim_select_resubmit_and_errors(served: Service) -> None:
    async with Orchestrator(home=served.home) as orch:
        j = await orch.jobs.add(sim_job(4, bulk=False, fail_submit={1: 1}, run_seconds=0.1,
                                        outcome={2: ["failed", "completed"]}))
        await j.submit(keep_going=True)  # subjob 1's first submission fails: it stays new
        await j.wait(timeout=30)
        assert [s.status for s in j.subjobs] == ["completed", "new", "failed", "completed"]
        assert j.status == "failed"
        failed = j.subjobs.select(status="failed")
        assert len(failed) == 1 and failed[0] is j.subjobs[2] and list(failed) == [j.subjobs[2]]
        assert [s.id for s in j.subjobs.select(status=["failed", "new"])] == [1, 2]
        assert [s.id for s in j.subjobs.select(name="sc*")] == [0, 1, 2, 3]
        assert len(j.subjobs.select(name="other*")) == 0
        with pytest.raises(ValueError, match="unknown status"):
            j.subjobs.select(status="bogus")

        await failed.resubmit()
        await j.wait(timeout=30)
        assert j.subjobs[2].status == "completed" and j.subjobs[2].info.submit_counter == 2
        await j.resubmit()  # the master: its failed and unsubmitted subjobs, here subjob 1
        await j.wait(timeout=30)
        assert j.status == "completed" and j.subjobs[1].info.submit_counter == 1
        assert [s.info.submit_counter for s in j.subjobs] == [1, 1, 2, 1]

        # Errors: the embedded API's types, naming the job.
        for key in (999, "999", "1.x", (j.id, 99), f"{j.id}.4"):
            with pytest.raises(KeyError):
                orch.jobs(key)
        assert orch.jobs.get(999) is None and 999 not in orch.jobs and j.id in orch.jobs
        with pytest.raises(IndexError):
            j.subjobs[4]
        with pytest.raises(JobError, match=f"job {j.id}: cannot submit a job that is completed") as refused:
            await j.submit()
        assert refused.value.fqid == str(j.id)
        with pytest.raises(JobError, match=f"job {j.id}.0: a subjob cannot be submitted"):
            await j.subjobs[0].submit()
        with pytest.raises(JobError, match="backend") as bad:
            await orch.jobs.add(Job(application=Executable("/bin/true"), backend="nope"))
        assert bad.value.field == "backend"
        with pytest.raises(JobError, match="already registered"):
            async with Orchestrator(home=served.home.parent / "embedded", service=False) as local:
                await orch.jobs.add(await local.jobs.add(Job(application=Executable("/bin/true"), backend="sim")))


async def test_statuses_follow_the_service_without_asking(served: Service) -> None:
    async with Orchestrator(home=served.home) as orch:
        j = await orch.jobs.add(sim_job(5, run_seconds=2.0))  # read in flight, however loaded the machine
        await j.submit()
        assert j.is_active() and j.status in ("submitted", "running")
        with anyio.fail_after(20):  # no operation here: only the event stream changes the cached statuses
            while j.status != "completed" or any(s.status != "completed" for s in j.subjobs):
                await anyio.sleep(0.02)
        assert not j.is_active()
        assert j.subjobs[3].info.timestamps.keys() >= {"submitted", "completed"}  # read again after the change


async def test_wait_timeout_kill_copy_and_remove(served: Service) -> None:
    async with Orchestrator(home=served.home) as orch:
        j = await orch.jobs.add(sim_job(4, run_seconds=60))
        await j.submit()
        with pytest.raises(TimeoutError):
            await j.wait(timeout=0.3)
        await j.subjobs[0:2].kill()
        assert [s.status for s in j.subjobs][:2] == ["killed", "killed"]
        with pytest.raises(JobError, match=f"job {j.id}: cannot remove a job that is"):
            await j.remove()
        await j.kill()
        assert j.status == "killed" and not j.is_active()
        await j.subjobs.select(status="killed").resubmit(backend=Backend("sim", run_seconds=0.05))
        await j.wait(timeout=30)
        assert j.status == "completed" and j.subjobs[3].backend.run_seconds == 0.05

        c = await j.subjobs[1].copy()
        assert c.parent is None and c.status == "new" and c.id == j.id + 1 and orch.jobs(c.id) is c  # type: ignore[operator]
        assert c.subjobs == [] and c.application is not None and c.application.args == ["1"]
        with pytest.raises(JobError, match="cannot be removed on its own"):
            await j.subjobs[0].remove()
        await c.remove()
        assert c.id not in orch.jobs and len(orch.jobs) == 1
        with pytest.raises(JobError, match="removed"):
            await c.submit()
        await j.remove()
        assert len(orch.jobs) == 0 and not (served.home / "workspace" / str(j.id)).exists()


async def test_jobs_of_other_clients_are_seen(served: Service) -> None:
    async with Orchestrator(home=served.home) as orch, ServiceClient.for_home(served.home) as other:
        added = await other.call("add", name="elsewhere", spec=sim_job(3, run_seconds=0.05).spec())
        job_id = int(added["id"])
        j = orch.jobs(job_id)  # not known yet: read from the service on the spot
        assert j.name == "elsewhere" and j.status == "new" and orch.jobs[job_id] is j
        await other.call("submit", targets=[str(job_id)])
        with anyio.fail_after(20):  # subjobs made by another client's submit reach this cache through events
            while j.status != "completed" or len(j.subjobs) != 3:
                await anyio.sleep(0.02)
        assert [s.status for s in j.subjobs] == ["completed"] * 3
        late = await other.call("add", name="later", spec=sim_job(1).spec())
        await other.call("submit", targets=[str(late["id"])])
        with anyio.fail_after(20):  # a new job's first status change brings the list up to date
            while len(orch.jobs) != 2:
                await anyio.sleep(0.02)
        assert [x.name for x in orch.jobs.select(name="late*")] == ["later"]


# ------------------------------------------------------------------ one home, one owner
async def test_an_embedded_orchestrator_is_refused_while_the_service_runs(served: Service, tmp_path: Path) -> None:
    with pytest.raises(HomeLockedError, match=r"in use by the orchestrator service, pid \d+"):
        async with Orchestrator(home=served.home, service=False):
            pass
    with pytest.raises(ServiceUnavailable, match="no orchestrator service holds"):
        async with Orchestrator(home=tmp_path / "nobody", service=True):
            pass
    async with Orchestrator(home=served.home) as remote:
        assert remote.remote
        with pytest.raises(OrchestratorError, match="open through its service"):
            remote.runtime  # noqa: B018  (the runtime is the service's)
    async with Orchestrator(home=tmp_path / "nobody") as embedded:  # no service there: the home is opened here
        assert not embedded.remote


async def scenario(orch: Any) -> dict[int, Any]:
    """The same code for both ways of opening a home: add and run a local and a sim job, report all jobs."""
    local = await orch.jobs.add(Job(name="echo", application=Executable("/bin/echo", args=["x"]),
                                    splitter=ArgSplitter([["a"], ["b"]]), backend="local"))
    sim = await orch.jobs.add(sim_job(3, name="sim", run_seconds=0.05, outcome={1: "failed"}))
    for job in (local, sim):
        await job.submit(keep_going=True)
        await job.wait(timeout=60)
        assert orch.jobs(job.id) is job and orch.jobs((job.id, 1)) is job.subjobs[1]
    assert [s.id for s in sim.subjobs.select(status="failed")] == [1]
    return {j.id: (j.name, j.status.value, [(s.status.value, s.info.submit_counter) for s in j.subjobs])
            for j in orch.jobs}


async def test_after_the_service_stops_the_same_code_runs_embedded(served: Service) -> None:
    async with Orchestrator(home=served.home) as orch:
        assert orch.remote
        first = await scenario(orch)
    assert first == {0: ("echo", "completed", [("completed", 1)] * 2),
                     1: ("sim", "failed", [("completed", 1), ("failed", 1), ("completed", 1)])}
    assert served.stop() == 0
    async with Orchestrator(home=served.home) as orch:
        assert not orch.remote
        seen = {j.id: (j.name, j.status.value, [(s.status.value, s.info.submit_counter) for s in j.subjobs])
                for j in orch.jobs}
        assert seen == first
        second = await scenario(orch)
    assert second == {**first, 2: first[0], 3: first[1]}


async def test_a_service_that_goes_away_fails_operations_not_the_block(served: Service) -> None:
    async with Orchestrator(home=served.home) as orch:
        j = await orch.jobs.add(sim_job(2, run_seconds=0.05))
        served.stop()
        with pytest.raises(ServiceUnavailable, match="does not answer"):
            await j.submit()
        assert j.status == "new"  # the cache stays readable
        await anyio.sleep(0.3)  # the event stream's reconnect attempts run meanwhile, quietly
    async with Orchestrator(home=served.home) as embedded:
        assert not embedded.remote and embedded.jobs(j.id).status == "new"
