"""The embedded API of docs/design.md's "Public API": lookups, slices, add, remove, wait, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from orchestrator import (
    ArgSplitter,
    Backend,
    ConfigError,
    Executable,
    FileSplitter,
    GenericSplitter,
    Job,
    JobError,
    JobStatus,
    Orchestrator,
    RepositoryError,
    RetryPolicy,
    TextMerger,
)

pytestmark = pytest.mark.anyio


async def test_the_design_example_on_local(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(Job(name="scan", application=Executable("/bin/echo", args=["x"]),
                                    splitter=ArgSplitter([["a"], ["b"], ["c"]]), backend="local"))
        assert j.subjobs == [] and j.parent is None and j.status == "new"
        await j.submit(keep_going=True)
        await j.wait(timeout=60)
        assert orch.jobs(j.id) is j and orch.jobs[j.id] is j
        assert orch.jobs((j.id, 1)) is j.subjobs[1] and orch.jobs(f"{j.id}.1") is j.subjobs[1]
        assert orch.jobs[j.id, 1] is j.subjobs[1]
        assert j.subjobs(2) is j.subjobs[2] and j.subjobs[2].fqid == f"{j.id}.2"
        assert j.status == JobStatus.COMPLETED and isinstance(j.status, str)
        for i, word in enumerate("abc"):
            out = j.subjobs[i].outputdir
            assert out == api_home / "workspace" / str(j.id) / str(i) / "output"
            assert (out / "stdout").read_text() == f"{word}\n"
            assert (out / "stderr").exists() and (out / "orch.log").exists()
        assert j.inputdir == api_home / "workspace" / str(j.id) / "input"
        failed = j.subjobs.select(status="failed")
        assert len(failed) == 0
        await failed.resubmit()


async def test_select_by_status_and_name(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        a = await orch.jobs.add(Job(name="scan-a", application=Executable("/bin/true"), backend="sim"))
        b = await orch.jobs.add(Job(name="scan-b", application=Executable("/bin/true"), backend="sim"))
        c = await orch.jobs.add(Job(name="other", application=Executable("/bin/true"), backend="sim"))
        await b.submit()
        await b.wait(timeout=10)
        assert [j.id for j in orch.jobs.select(name="scan*")] == [a.id, b.id]
        assert [j.id for j in orch.jobs.select(status="new")] == [a.id, c.id]
        assert [j.id for j in orch.jobs.select(status=["completed"], name="scan-?")] == [b.id]
        assert len(orch.jobs) == 3 and [j.id for j in orch.jobs] == [a.id, b.id, c.id]
        with pytest.raises(ValueError, match="unknown status"):
            orch.jobs.select(status="bogus")
        with pytest.raises(KeyError):
            orch.jobs(999)
        with pytest.raises(KeyError):
            orch.jobs("1.x")


async def test_ids_are_consecutive_integers(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        ids = [(await orch.jobs.add(Job(application=Executable("/bin/true"), backend="sim"))).id for _ in range(3)]
        assert ids == [0, 1, 2]


@pytest.mark.parametrize(("job", "field"), [
    (Job(application=Executable("/bin/true"), backend="nope"), "backend"),
    (Job(application=Executable("/bin/true"), backend=Backend("sim", run_seconds=-1)), "backend.run_seconds"),
    (Job(application=Executable("/bin/true"), backend=Backend("sim", colour="red")), "backend.colour"),
    (Job(application=Executable("/bin/true"), backend=Backend("local", cores=3)), "backend.cores"),
    (Job(application=None, backend="sim"), "application"),
    (Job(application=Executable(""), backend="sim"), "application.exe"),
    (Job(application=Executable("/bin/true", args="a b"), backend="sim"), "application.args"),  # type: ignore[arg-type]
    (Job(application=Executable("/bin/true", env={"1X": "y"}), backend="sim"), "application.env"),
    (Job(application=Executable("/bin/true"), backend="sim", mode="prod"), "mode"),
    (Job(application=Executable("/bin/true"), backend="sim", outputfiles=["../x"]), "outputfiles"),
    (Job(application=Executable("/bin/true"), backend="sim", retry=RetryPolicy(max_early=-1)), "retry.max_early"),
    (Job(application=Executable("/no/such/program"), backend="local"), "application.exe"),  # runs here: checked
    (Job(application=Executable("/bin/true", args=["x" * 131072]), backend="sim"), "application.args"),
    (Job(application=Executable("/bin/true", args=["x" * 100000] * 30), backend="sim"), "application.args"),
    (Job(application=Executable("/bin/true", env={"BIG": "x" * 131072}), backend="sim"), "application.env"),
])
async def test_bad_input_is_refused_at_add_naming_the_field(api_home: Path, job: Job, field: str) -> None:
    async with Orchestrator(home=api_home) as orch:
        with pytest.raises(JobError, match=f"field {field}"):
            await orch.jobs.add(job)
        assert len(orch.jobs) == 0
    async with Orchestrator(home=api_home) as orch:
        assert len(orch.jobs) == 0


async def test_limits_the_system_sets_are_checked_for_each_subjob_at_the_split(api_home: Path) -> None:
    """A subjob whose arguments exec would refuse (exit 126 at run time) is refused at submit, named."""
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/echo"), backend="local",
                                    splitter=ArgSplitter([["a"], ["b" * 200000], ["c"]])))
        with pytest.raises(JobError, match=r"job 0\.1.*131071 bytes in one argument.*field application\.args"):
            await j.submit()
        assert j.status == "new" and len(j.subjobs) == 0  # nothing was split or stored
        k = await orch.jobs.add(Job(application=Executable("/bin/echo"), backend="local",
                                    splitter=GenericSplitter(attribute="application.exe",
                                                             values=["/bin/echo", "/no/such/exe"])))
        with pytest.raises(JobError, match=r"job 1\.1: /no/such/exe does not exist.*field application\.exe"):
            await k.submit()


async def test_remove_forgets_a_final_or_new_job_and_its_workspace(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/echo", args=["hi"]), backend="local",
                                    splitter=ArgSplitter([["1"], ["2"]])))
        n = await orch.jobs.add(Job(application=Executable("/bin/true"), backend="sim"))
        await j.submit()
        await j.wait(timeout=30)
        assert (api_home / "workspace" / str(j.id)).exists()
        await j.remove()
        await n.remove()
        assert j.id not in orch.jobs and len(orch.jobs) == 0
        assert not (api_home / "workspace" / str(j.id)).exists()
        r = await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("sim", run_seconds=30)))
        await r.submit()
        with pytest.raises(JobError, match="kill it first"):
            await r.remove()
        await r.kill()
        await r.remove()
    async with Orchestrator(home=api_home) as orch:
        assert len(orch.jobs) == 0


async def test_wait_times_out(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("sim", run_seconds=30)))
        await j.submit()
        with pytest.raises(TimeoutError, match=f"^job {j.id} still active after 0.3 s$"):
            await j.wait(timeout=0.3)
        done = await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("sim")))
        await done.submit()
        await done.wait(timeout=10)
        with pytest.raises(TimeoutError, match=f"^job {j.id} still active after 0.2 s$"):  # the active one only
            await orch.jobs.select(ids=[j.id, done.id]).wait(timeout=0.2)
        await j.kill()
        await j.wait(timeout=1)


async def test_single_job_without_splitter_follows_the_table(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        # long enough to be seen active after submit() returned, through a loaded service too
        j = await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("sim", run_seconds=1.5)))
        await j.submit()
        assert j.status in ("submitted", "running") and j.subjobs == []
        await j.wait(timeout=10)
        assert j.status == "completed" and j.info.submit_counter == 1
        await j.resubmit()
        await j.wait(timeout=10)
        assert j.info.submit_counter == 2
        for key in ("new", "submitting", "submitted", "completed", "final"):
            assert key in j.info.timestamps
        bad = await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("sim", fail_submit=[0])))
        with pytest.raises(JobError, match="submission failed"):
            await bad.submit()
        assert bad.status == "new" and bad.info.submit_counter == 0


async def test_running_first_order_setting(tmp_path: Path) -> None:
    """Subjob 0 runs while subjob 1 waits in the backend's queue: the order of rules 1 and 2 decides."""
    backend = Backend("sim", run_seconds=30, queued={1: 30})
    config = {"core": {"master_status_order": "running-first"}}
    for home, order, shown in ((tmp_path, config, "running"), (tmp_path / "b", None, "submitted")):
        async with Orchestrator(home=home, config=order) as orch:
            j = await orch.jobs.add(Job(application=Executable("/bin/true"), splitter=ArgSplitter([["a"], ["b"]]),
                                        backend=backend))
            await j.submit()
            with anyio.fail_after(10):
                while j.subjobs[0].status != "running":
                    await anyio.sleep(0.01)
            assert j.subjobs[1].status == "submitted" and j.status == shown
            await j.kill()


@pytest.mark.parametrize("order", ["bogus", "", "Running-First", "running_first", 1])
async def test_an_invalid_master_status_order_is_refused(tmp_path: Path, order: object) -> None:
    """Through the configuration, in Orchestrator(config=...) and in the home's orchestrator.toml alike."""
    with pytest.raises(ConfigError, match="core.master_status_order must be one of"):
        async with Orchestrator(home=tmp_path, config={"core": {"master_status_order": order}}):
            pass
    (tmp_path / "orchestrator.toml").write_text(f"[core]\nmaster_status_order = {json.dumps(order)}\n")
    with pytest.raises(ConfigError, match=f"{tmp_path / 'orchestrator.toml'}: core.master_status_order"):
        async with Orchestrator(home=tmp_path):
            pass


async def test_generic_and_file_splitters(api_home: Path, tmp_path: Path) -> None:
    files = []
    for i in range(5):
        f = tmp_path / f"in{i}.txt"
        f.write_text(f"line {i}\n")
        files.append(str(f))
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", "cat in*.txt"]), backend="local",
                                    inputfiles=files, splitter=FileSplitter(files_per_job=2),
                                    merger=TextMerger(files=["stdout"])))
        await j.submit()
        assert [s.inputfiles for s in j.subjobs] == [files[0:2], files[2:4], files[4:5]]
        await j.wait(timeout=30)
        assert j.status == "completed"
        assert (j.outputdir / "stdout").read_text() == "".join(f"line {i}\n" for i in range(5))
        g = await orch.jobs.add(Job(name="g", application=Executable("/bin/true"), backend="sim",
                                    splitter=GenericSplitter(multi_attrs={"name": ["x", "y"],
                                                                          "backend.run_seconds": [0.01, 0.02],
                                                                          "application.env": [{"A": "1"}, {}]})))
        await g.submit()
        assert [s.name for s in g.subjobs] == ["x", "y"]
        assert [s.backend.run_seconds for s in g.subjobs] == [0.01, 0.02]
        assert g.subjobs[0].application.env == {"A": "1"}
        await g.wait(timeout=10)
        none = await orch.jobs.add(Job(application=Executable("/bin/true"), backend="sim",
                                       splitter=FileSplitter(files_per_job=2)))
        with pytest.raises(JobError, match="inputfiles"):
            await none.submit()


async def test_text_merger_fails_the_master_unless_ignorefailed(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        sh = Executable("/bin/sh", args=["-c", 'echo "$0"; [ "$0" != bad ]'])
        strict = await orch.jobs.add(Job(application=sh, backend="local", merger=TextMerger(files=["stdout"]),
                                         splitter=GenericSplitter("application.args",
                                                                  [["-c", 'echo "$0"; [ "$0" != bad ]', w]
                                                                   for w in ("ok", "bad", "fine")])))
        lenient = await strict.copy()
        lenient.merger = TextMerger(files=["stdout"], ignorefailed=True)
        await strict.submit()
        await lenient.submit()
        await strict.wait(timeout=30)
        await lenient.wait(timeout=30)
        assert [s.status.value for s in strict.subjobs] == ["completed", "failed", "completed"]
        assert strict.status == "failed" and not (strict.outputdir / "stdout").exists()
        assert lenient.status == "failed"  # rule 4 still holds: a subjob failed
        assert (lenient.outputdir / "stdout").read_text() == "ok\nfine\n"
        await strict.subjobs[1].resubmit(backend=None)
        await strict.wait(timeout=30)
        assert strict.subjobs[1].status == "failed"


async def test_workspace_attribute_is_the_jobs_directory(api_home: Path) -> None:
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/true"), backend="sim",
                                    splitter=ArgSplitter([["a"], ["b"]])))
        await j.submit()
        assert j.workspace == api_home / "workspace" / str(j.id)
        assert j.subjobs[1].workspace == j.workspace / "1"
        assert j.subjobs[1].outputdir == j.subjobs[1].workspace / "output"
        await j.wait(timeout=10)


async def test_a_job_outlives_its_orchestrator_and_says_so_when_it_needs_the_home(
        api_home: Path, request: pytest.FixtureRequest) -> None:
    """After the orchestrator closes, a job object still answers from what it holds (its id, its last status,
    how many subjobs it has). A detail read from the home (a subjob's definition) still comes from a service
    that holds the home; without one, it is refused with a :class:`RepositoryError` naming the repository,
    not an internal error."""
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/true"), backend="sim",
                                    splitter=ArgSplitter([["1"], ["2"], ["3"]])))
        await j.submit()
        await j.wait(timeout=30)
    assert j.status == "completed" and len(j.subjobs) == 3
    if request.node.callspec.params["api_home"].startswith("service"):
        assert [s.application.args for s in j.subjobs if s.application] == [["1"], ["2"], ["3"]]
    else:
        with pytest.raises(RepositoryError, match=r" is closed: .*open the home again"):
            [s.application for s in j.subjobs]
    async with Orchestrator(home=api_home) as orch:
        assert [s.status for s in orch.jobs[j.id].subjobs] == ["completed"] * 3
