"""docs/design.md "Submission, keep_going, bulk", sentence by sentence, on the sim backend."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest
from stored import read_jobs_and_subjobs

from orchestrator import ArgSplitter, Backend, Executable, GenericSplitter, Job, JobError, Orchestrator
from orchestrator.core.events import StatusChanged

pytestmark = pytest.mark.anyio


def sim_job(n: int = 5, **settings: object) -> Job:
    settings.setdefault("run_seconds", 0.05)
    return Job(name="scan", application=Executable("/bin/true"), splitter=ArgSplitter([[str(i)] for i in range(n)]),
               backend=Backend("sim", **settings))


async def stored_subjobs(home: Path, master: int | None) -> int:
    """How many subjobs of ``master`` the repository holds (read as a reader reads a home)."""
    _, subjobs = await read_jobs_and_subjobs(home)
    return len(subjobs[master]) if master in subjobs else 0


def statuses(job: Job) -> list[str]:
    return [s.status.value for s in job.subjobs]


async def sim_calls(orch: Orchestrator) -> dict[str, int]:
    """How often the sim driver was called, by method (its metrics, as any monitoring reads them)."""
    return (await orch.metrics())["backends"]["sim"]["driver"]["calls"]  # type: ignore[no-any-return]


def sim_faults(home: Path, **faults: str) -> None:
    """Switch the sim backend's faults (its documented ``faults.json``); none given switches them off."""
    path = home / "backends" / "sim" / "faults.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(faults))


async def test_subjobs_made_at_submit_in_splitter_order(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(4))
        assert j.subjobs == [] and j.parent is None and j.status == "new"
        await j.submit()
        assert [s.id for s in j.subjobs] == [0, 1, 2, 3]
        assert all(s.parent is j for s in j.subjobs)
        assert [s.application.args for s in j.subjobs] == [["0"], ["1"], ["2"], ["3"]]  # type: ignore[union-attr]
        assert all(s.name == "scan" and s.backend.name == "sim" for s in j.subjobs)
        assert (await stored_subjobs(api_home, j.id)) == 4
        await j.wait(timeout=10)
        assert j.status == "completed" and statuses(j) == ["completed"] * 4
        assert j.info.submit_counter == 1 and all(s.info.submit_counter == 1 for s in j.subjobs)


async def test_master_is_submitting_while_submit_runs(api_home: Path) -> None:
    seen: list[str] = []
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(200, bulk=False))

        async def watch() -> None:
            while not seen or seen[-1] == "new" or j.status == "submitting":
                seen.append(j.status.value)
                await anyio.sleep(0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await anyio.sleep(0)
            await j.submit(keep_going=True)
        assert "submitting" in seen
        assert j.status in ("submitted", "running", "completed")


@pytest.mark.parametrize("bulk", [False, True])
async def test_keep_going_true_attempts_everything_and_succeeds(api_home: Path, bulk: bool) -> None:
    async with Orchestrator(home=api_home) as orch:
        # runs of 2 s: still on their way when the statuses are read, however loaded the machine
        j = await orch.jobs.add(sim_job(5, bulk=bulk, fail_submit=[1, 3], run_seconds=2.0))
        await j.submit(keep_going=True)
        left = "failed" if bulk else "new"  # native: rejected -> failed; emulated: left new
        assert statuses(j)[1] == left and statuses(j)[3] == left
        assert all(statuses(j)[i] in ("submitted", "running") for i in (0, 2, 4))
        await j.wait(timeout=30)
        assert statuses(j) == ["completed", left, "completed", left, "completed"]
        assert j.status == "failed"  # rule 4: a failed or new subjob
        assert "fail_submit" in (j.subjobs[1].info.reason or "")


async def test_emulated_keep_going_false_stops_at_first_failure(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        # runs of 2 s: still on their way when the statuses are read, however loaded the machine
        j = await orch.jobs.add(sim_job(5, bulk=False, fail_submit=[2], run_seconds=2.0))
        with pytest.raises(JobError, match="2"):
            await j.submit(keep_going=False)
        assert statuses(j)[2:] == ["new", "new", "new"]
        assert statuses(j)[0] in ("submitted", "running") and statuses(j)[1] in ("submitted", "running")
        assert (await sim_calls(orch))["submit"] == 3
        # The subjobs that were submitted are monitored to the end all the same.
        await j.wait(timeout=30)
        assert statuses(j) == ["completed", "completed", "new", "new", "new"]
        assert j.status == "failed"


async def test_native_keep_going_false_raises_but_keeps_the_rest(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(4, bulk=True, fail_submit=[0]))
        with pytest.raises(JobError):
            await j.submit(keep_going=False)
        assert (await sim_calls(orch))["submit_bulk"] == 1
        assert statuses(j)[0] == "failed"
        await j.wait(timeout=10)
        assert statuses(j) == ["failed", "completed", "completed", "completed"]


#: Submissions go out ten runs at a time (the runtime's part: the same through a service).
CHUNKS_OF_TEN = {"core": {"submit_chunk": 10}}


async def test_a_large_submission_goes_out_and_is_answered_a_chunk_at_a_time(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path, config=CHUNKS_OF_TEN) as orch:
        j = await orch.jobs.add(sim_job(35, run_seconds=0))
        await j.submit()
        await j.wait(timeout=10)
        assert statuses(j) == ["completed"] * 35 and j.status == "completed"
        assert (await sim_calls(orch))["submit_bulk"] == 4  # 10 + 10 + 10 + 5
        assert j.subjobs[34].backend_id is not None and j.subjobs[34].info.submit_counter == 1


@pytest.mark.parametrize("bulk", [False, True])
async def test_keep_going_false_across_chunks(tmp_path: Path, bulk: bool) -> None:
    """Emulated: the series stops at its first failure, later chunks are not attempted. Native: a refused run is
    that run's failure, the other chunks go out; the request fails either way."""
    async with Orchestrator(home=tmp_path, config=CHUNKS_OF_TEN) as orch:
        j = await orch.jobs.add(sim_job(30, bulk=bulk, fail_submit=[12]))
        with pytest.raises(JobError, match="12"):
            await j.submit(keep_going=False)
        await j.wait(timeout=10)
        if bulk:
            assert statuses(j) == ["completed"] * 12 + ["failed"] + ["completed"] * 17
        else:
            assert statuses(j) == ["completed"] * 12 + ["new"] * 18
            assert (await sim_calls(orch))["submit"] == 13


async def test_native_failure_reported_later_goes_submitted_then_failed(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(3, bulk=True, outcome={1: "failed"}))
        history: list[str] = []

        async def follow() -> None:
            async for ev in orch.events():
                if isinstance(ev, StatusChanged) and (j.id, 1) in ev.ids:
                    history.append(ev.new.value)

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await anyio.sleep(0)
            await j.submit(keep_going=True)
            await j.wait(timeout=10)
            tg.cancel_scope.cancel()
        assert history[0] == "submitting" and "submitted" in history and history[-1] == "failed"
        assert j.status == "failed"


@pytest.mark.parametrize("keep_going", [False, True])
@pytest.mark.parametrize("bulk", [False, True])
async def test_rollback_when_nothing_could_be_submitted(api_home: Path, bulk: bool, keep_going: bool) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(3, bulk=bulk, fail_submit=[0, 1, 2]))
        if bulk:
            # Native bulk: rejected subjobs are failed, not left new, so there is no rollback.
            if keep_going:
                await j.submit(keep_going=True)
            else:
                with pytest.raises(JobError):
                    await j.submit(keep_going=False)
            assert statuses(j) == ["failed"] * 3 and j.status == "failed"
            return
        with pytest.raises(JobError, match="no subjob could be submitted"):
            await j.submit(keep_going=keep_going)
        assert j.status == "new" and j.subjobs == [] and j.info.submit_counter == 0
        assert (await stored_subjobs(api_home, j.id)) == 0
        assert not (api_home / "workspace" / str(j.id)).exists()


async def test_rollback_when_the_driver_call_fails_as_a_whole(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(3, bulk=True))
        sim_faults(api_home, submit="raise")
        with pytest.raises(JobError, match="unreachable"):
            await j.submit(keep_going=True)
        assert j.status == "new" and j.subjobs == [] and (await stored_subjobs(api_home, j.id)) == 0


async def test_rollback_on_splitter_error(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/true"), backend="sim",
                                    splitter=GenericSplitter(multi_attrs={"application.args": [["a"], ["b"]],
                                                                          "name": ["x"]})))
        with pytest.raises(JobError, match="differ in length"):
            await j.submit()
        assert j.status == "new" and j.subjobs == [] and j.info.submit_counter == 0
        assert (await stored_subjobs(api_home, j.id)) == 0 and not (api_home / "workspace" / str(j.id)).exists()
        bad_attr = await orch.jobs.add(Job(application=Executable("/bin/true"), backend="sim",
                                           splitter=GenericSplitter("application.nope", [1, 2])))
        with pytest.raises(JobError, match="application.nope"):
            await bad_attr.submit()
        assert bad_attr.status == "new" and bad_attr.subjobs == []


async def test_rollback_on_configure_error(api_home: Path, tmp_path: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/true"), backend="sim",
                                    inputfiles=[str(tmp_path / "missing.txt")], splitter=ArgSplitter([["a"], ["b"]])))
        with pytest.raises(JobError, match="inputfiles"):
            await j.submit()
        assert j.status == "new" and j.subjobs == []
        assert (await stored_subjobs(api_home, j.id)) == 0
        assert not (api_home / "workspace" / str(j.id)).exists()
        # A bad argument from the splitter is refused before anything exists.
        k = await orch.jobs.add(Job(application=Executable("/bin/true"), backend="sim",
                                    splitter=ArgSplitter([["a"], [{"not": "a string"}]])))
        with pytest.raises(JobError, match="application.args"):
            await k.submit()
        assert k.status == "new" and k.subjobs == [] and (await stored_subjobs(api_home, k.id)) == 0


async def test_subjob_left_new_is_submitted_by_resubmit(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(3, bulk=False, fail_submit={1: 1}, run_seconds=2.0))  # read in flight
        await j.submit(keep_going=True)
        assert statuses(j)[1] == "new"
        await j.subjobs[1].resubmit()
        assert j.subjobs[1].status in ("submitted", "running") and j.subjobs[1].info.submit_counter == 1
        await j.wait(timeout=30)
        assert j.status == "completed"


async def test_fail_submit_counts_submissions_across_reopen(api_home: Path) -> None:
    """``fail_submit={i: n}``: the first n submissions of subjob i fail, counted across reopens of the home."""
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(3, bulk=False, fail_submit={1: 2}))
        await j.submit(keep_going=True)
        assert statuses(j)[1] == "new"  # the first submission failed
    async with Orchestrator(home=api_home) as orch:
        j = orch.jobs[0]
        with pytest.raises(JobError, match="fail_submit"):
            await j.subjobs[1].resubmit()  # the second
        assert statuses(j)[1] == "new"
    async with Orchestrator(home=api_home) as orch:
        j = orch.jobs[0]
        await j.subjobs[1].resubmit()  # the third goes through
        await j.wait(timeout=10)
        assert j.status == "completed"


async def test_subjob_cannot_be_submitted_or_removed_alone(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(2))
        await j.submit()
        await j.wait(timeout=10)
        with pytest.raises(JobError, match="resubmit"):
            await j.subjobs[0].submit()
        with pytest.raises(JobError, match="removed"):
            await j.subjobs[0].remove()
        with pytest.raises(JobError):
            await j.submit()  # not new any more
        assert len(j.subjobs) == 2


async def test_copy_of_a_subjob_is_a_new_toplevel_job(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(3))
        await j.submit()
        c = await j.subjobs[2].copy()
        assert c.parent is None and c.status == "new" and c.id != j.id
        assert c.application.args == ["2"] and c.subjobs == [] and c.splitter is None
        assert orch.jobs(c.id) is c
        m = await j.copy()
        assert m.parent is None and m.status == "new" and m.subjobs == [] and m.splitter == j.splitter
        await j.wait(timeout=10)


async def test_a_copy_shares_no_object_with_its_original(api_home: Path) -> None:
    from orchestrator import TextMerger

    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(Job(name="scan", application=Executable("/bin/true", args=["a"]),
                                    splitter=ArgSplitter([["0"], ["1"], ["2"]]), merger=TextMerger(files=["stdout"]),
                                    backend=Backend("sim", run_seconds=0.01)))
        c = await j.copy()
        assert c.splitter is not j.splitter and c.merger is not j.merger and c.backend is not j.backend
        assert c.application is not j.application
        c.splitter.args.append(["3"])  # type: ignore[union-attr]
        c.merger.files.append("stderr")  # type: ignore[union-attr]
        c.application.args.append("b")  # type: ignore[union-attr]
        assert j.splitter.args == [["0"], ["1"], ["2"]]  # type: ignore[union-attr]
        assert j.merger.files == ["stdout"] and j.application.args == ["a"]  # type: ignore[union-attr]
        await j.submit()
        await j.wait(timeout=10)
        assert len(j.subjobs) == 3  # the original's own splitter


async def test_kill_and_resubmit_single_subjobs(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(3, run_seconds=30))
        await j.submit()
        await j.subjobs[1].kill()
        assert statuses(j) == ["submitted", "killed", "submitted"] or statuses(j)[1] == "killed"
        assert j.status in ("submitted", "running")
        await j.subjobs[1].kill()  # killing a final job is a no-op
        await j.subjobs[1].resubmit()
        assert j.subjobs[1].status in ("submitted", "running") and j.subjobs[1].info.submit_counter == 2
        await j.kill()
        assert statuses(j) == ["killed"] * 3 and j.status == "killed"
        await j.kill()  # every subjob final: a no-op


async def test_killing_a_new_job_is_an_error(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(2))
        with pytest.raises(JobError, match="never submitted"):
            await j.kill()
        single = await orch.jobs.add(Job(application=Executable("/bin/true"), backend="sim"))
        with pytest.raises(JobError, match="never submitted"):
            await single.kill()
        k = await orch.jobs.add(sim_job(3, bulk=False, fail_submit=[2], run_seconds=60))  # still running at the kill
        await k.submit(keep_going=True)
        with pytest.raises(JobError, match="never submitted"):
            await k.subjobs[2].kill()
        await k.kill()  # the master kills its active subjobs, whatever the others are
        assert statuses(k) == ["killed", "killed", "new"]


async def test_master_with_a_failed_subjob_is_still_killable(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        # Subjob 0 fails at once; 1 and 2 wait in the backend's queue.
        j = await orch.jobs.add(sim_job(3, run_seconds=0.05, outcome={0: "failed"}, queued={1: 30, 2: 30}))
        await j.submit()
        await j.subjobs[0].wait(timeout=5)
        assert j.subjobs[0].status == "failed"
        await j.kill()
        assert statuses(j) == ["failed", "killed", "killed"] and j.status == "failed"
        assert (await sim_calls(orch))["kill_bulk"] == 1


async def test_master_resubmit_takes_failed_only_unless_asked(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        # subjob 3 waits a minute in the backend's queue: it is surely active when killed, however loaded the host
        j = await orch.jobs.add(sim_job(4, outcome={0: ["failed", "completed"]}, run_seconds=0.05,
                                        queued={0: 1, 3: 60}))
        await j.submit()
        await j.subjobs[3].kill()
        await j.wait(timeout=10)
        assert statuses(j) == ["failed", "completed", "completed", "killed"]
        await j.resubmit()
        assert j.status == "submitted"  # rule 1, from failed (subjob 0 waits 1 s in the backend's queue)
        assert [s.info.submit_counter for s in j.subjobs] == [2, 1, 1, 1]
        await j.wait(timeout=10)
        assert statuses(j) == ["completed", "completed", "completed", "killed"]
        await j.resubmit(only_failed=False, backend=Backend("sim", run_seconds=0.05))  # no queue this time
        await j.wait(timeout=10)
        assert statuses(j) == ["completed"] * 4 and j.status == "completed"
        assert [s.info.submit_counter for s in j.subjobs] == [2, 1, 1, 2]


async def test_resubmitting_one_subjob_moves_master_back_to_submitted(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(2, run_seconds=0.01, queued={0: 0.5}))  # each run of 0 queues 0.5 s
        await j.submit()
        await j.wait(timeout=10)
        assert j.status == "completed"
        await j.subjobs[0].resubmit()
        assert j.status == "submitted"
        await j.wait(timeout=10)
        assert j.status == "completed" and j.subjobs[0].info.submit_counter == 2


async def test_resubmit_with_new_backend_settings_but_never_a_new_type(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(2, outcome={1: "failed"}, run_seconds=0.01))
        await j.submit()
        await j.wait(timeout=10)
        with pytest.raises(JobError, match="type"):
            await j.resubmit(backend="local")
        await j.resubmit(backend=Backend("sim", run_seconds=0.02))
        assert j.subjobs[1].backend.run_seconds == 0.02 and j.backend.run_seconds == 0.02
        await j.wait(timeout=10)
        assert j.status == "completed"  # the new settings have no outcome for index 1


async def test_two_concurrent_resubmits_of_one_subjob_are_serialised(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        # runs of 1 s: the second resubmit finds the first's run still on its way (submitted, or already running)
        j = await orch.jobs.add(sim_job(2, outcome={0: "failed"}, run_seconds=1.0))
        await j.submit()
        await j.wait(timeout=10)
        errors: list[BaseException] = []

        async def resubmit() -> None:
            try:
                await j.subjobs[0].resubmit()
            except JobError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(resubmit)
            tg.start_soon(resubmit)
        # One resubmitted; the other ran after it and found the subjob already active.
        assert len(errors) == 1 and re.search(r"cannot resubmit a job that is (submitted|running)", str(errors[0]))
        assert j.subjobs[0].info.submit_counter == 2
        assert (await sim_calls(orch))["submit_bulk"] == 2
        await j.wait(timeout=10)


async def test_collective_operations_on_slices(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(6, outcome={1: ["failed", "completed"], 4: ["failed", "completed"]},
                                        run_seconds=0.01, queued={1: 0.5, 4: 0.5}))
        await j.submit()
        await j.wait(timeout=10)
        failed = j.subjobs.select(status="failed")
        assert len(failed) == 2 and [s.id for s in failed] == [1, 4] and failed[0] is j.subjobs[1]
        await failed.resubmit()
        assert j.status == "submitted"
        await j.wait(timeout=10)
        assert statuses(j) == ["completed"] * 6


@pytest.mark.parametrize("keep_going", [False, True])
async def test_slice_kill_follows_keep_going(api_home: Path, keep_going: bool) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(sim_job(4, bulk=False, fail_submit=[1], run_seconds=30, queued={0: 30, 2: 30, 3: 30}))
        await j.submit(keep_going=True)
        assert statuses(j) == ["submitted", "new", "submitted", "submitted"]  # (queued in the backend)
        everything = j.subjobs[0:4]
        if keep_going:
            await everything.kill(keep_going=True)  # the new one is skipped, the rest killed
            assert statuses(j) == ["killed", "new", "killed", "killed"]
        else:
            with pytest.raises(JobError, match="never submitted"):
                await everything.kill(keep_going=False)  # stops at the first refusal
            got = statuses(j)  # the ones after the refusal were not touched: still going
            assert got[:2] == ["killed", "new"] and all(s in ("submitted", "running") for s in got[2:])
            await j.kill()
