"""Workflows on the local backend: real sh packages that produce and consume files in the shared data dir."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
from test_workflow_dag import PRODUCE, expected_edges, sh, use_case_iv

from orchestrator import Executable, Job, Orchestrator, RetryPolicy
from orchestrator.features.workflows import (
    FileSpec,
    Line,
    Package,
    Stage,
    Workflow,
    WorkflowError,
    WorkflowRun,
    Workflows,
    parse_dagman,
)
from orchestrator.features.workflows.dagman import node_name
from orchestrator.plugin.wrapper import read_log

pytestmark = pytest.mark.anyio
FAST = {"core": {"poll_interval": 0.05, "flush_interval": 0.05}}


def config(**workflow: int) -> dict[str, dict[str, float]]:
    return {**FAST, "workflow": dict(workflow)} if workflow else FAST


async def until(predicate: Callable[[], bool], timeout: float = 15) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


def check_order(w: WorkflowRun) -> None:
    """Every package started only after each of its producers completed: by the orchestrator's
    timestamps, and by the wrapper's own clock (the consumer's START after the producer's END)."""
    for key, p in w.packages.items():
        for parent in p.parents:
            q = w.packages[parent]
            assert p.job is not None and q.job is not None
            assert p.job.info.timestamps["submitted"] >= q.job.info.timestamps["completed"], (parent, key)
            started, ended = read_log(p.job.outputdir).started, read_log(q.job.outputdir).ended
            assert started is not None and ended is not None and started >= ended, (parent, key)


def overlap(w: WorkflowRun) -> int:
    """Most packages whose processes ran at the same time (from the wrapper logs)."""
    events = []
    for p in w.packages.values():
        assert p.job is not None
        log = read_log(p.job.outputdir)
        events += [(log.started, 1), (log.ended, -1)]
    running = most = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start at the same instant
        running += delta
        most = max(most, running)
    return most


# ------------------------------------------------------------ use case IV
async def test_use_case_iv_runs_in_dependency_order_and_disposes_of_files(tmp_path: Path) -> None:
    n = 5
    tape, store = tmp_path / "tape", tmp_path / "store"
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch, Workflows(orch) as wfs:
        w = await wfs.submit(use_case_iv(n, tape, store))
        assert all(p.state in ("submitted", "running") for p in list(w.packages.values())[:n])  # stage 1 started
        assert all(p.state == "waiting" and p.job is None for p in list(w.packages.values())[n:])
        assert await w.wait(timeout=40) == "completed"
        assert len(w.packages) == 4 * n and all(p.state == "completed" for p in w.packages.values())
        assert len(orch.jobs) == 4 * n and {j.name for j in orch.jobs} == {f"reco001/{k}" for k in w.packages}
        check_order(w)
        data = w.datadir
        for i in range(1, n + 1):
            # Producers and consumers really exchanged files: the analysis holds the raw data.
            assert f"raw event data {i}" in (data / f"ana_{i}.root").read_text()
            assert (data / f"ana_filtered_{i}.root").read_text().startswith(f"raw event data {i}")
            assert (store / f"reco_{i}_a.root").is_file() and (store / f"reco_{i}_b.root").is_file()
            # Dispositions: deletable intermediates (and raw copies) are gone, retained files remain.
            assert not (data / f"reco_{i}_a.root").exists() and not (data / f"reco_{i}_b.root").exists()
            assert not (data / f"raw_{i}.dat").exists() and (tape / f"raw_{i}.dat").is_file()
            assert (data / f"filtered_{i}.root").is_file()
        assert set(w.state["deleted"]) == {f"reco_{i}_{x}.root" for i in range(1, n + 1) for x in "ab"} | {
            f"raw_{i}.dat" for i in range(1, n + 1)}
        # The DAGMan export, parsed back, has exactly the implied DAG's edges.
        parsed = parse_dagman(w.dagman())
        assert parsed.edges == {(node_name(p), node_name(c)) for p, c in w.dag.edges()}
        assert parsed.edges == {(node_name(p), node_name(c)) for p, c in expected_edges(n)}
        assert parsed.retries == {node_name(k): 1 for k in w.packages} and parsed.done == set(parsed.jobs)
        out = w.write_dagman(tmp_path / "export" / "reco001.dag")
        assert (out.parent / "S1_L1_P1.sub").read_text().count('requirements = (Machine == "localhost")') == 1


# ------------------------------------------------------------------- kill
async def test_kill_line_without_drop_blocks_consumers_then_drop_lets_them_start(tmp_path: Path) -> None:
    slow = f'if [ "$ORCH_INPUTS" = raw_1.dat ]; then sleep 30; fi; {PRODUCE}'
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch, Workflows(orch) as wfs:
        w = await wfs.submit(use_case_iv(2, tmp_path / "tape", tmp_path / "store", pause=0.1, reco=slow))
        await until(lambda: w.packages["1.1.1"].state == "running")
        assert await w.kill_line(1, 1) == ["1.1.1"]
        assert w.packages["1.1.1"].state == "killed"
        assert await w.wait(timeout=20) == "blocked"
        consumers = ["2.1.1", "2.2.1", "2.3.1"]
        for key in consumers:  # they stay waiting for the files the killed line will not make
            p = w.packages[key]
            assert p.state == "waiting" and p.job is None and p.waiting_for
        assert all(w.packages[k].state == "completed" for k in ("1.2.1", "2.4.1", "2.5.1", "2.6.1"))
        # Killing it again, with its future outputs dropped: the consumers start without them.
        assert await w.kill_line("1", "1", drop_outputs=True) == ["1.1.1"]
        assert all(w.packages[k].state in ("submitted", "running", "completed") for k in consumers)
        assert await w.wait(timeout=20) == "completed"
        assert all(w.packages[k].state == "completed" for k in consumers)
        assert (w.datadir / "ana_1.root").read_text() == "ana_1.root\n"  # made from no input at all
        assert w.packages["1.1.1"].state == "killed" and "reco_1_a.root" in w.dropped
        assert parse_dagman(w.dagman()).edges == {(node_name(p), node_name(c)) for p, c in expected_edges(2)
                                                  if p != "1.1.1"}
        with pytest.raises(WorkflowError, match="no line 1.9"):
            await w.kill_line(1, 9)


# --------------------------------------------------- retries and restarts
async def test_failed_package_is_retried_while_consumers_wait_and_resumes_at_its_binary(tmp_path: Path) -> None:
    flaky = f'if [ "$ORCH_RETRY_COUNT" = 0 ]; then sleep 0.3; exit 1; fi; {PRODUCE}'
    chained = Workflow(id="chain", stages=[Stage([Line([Package([
        sh("echo once >> b1.count; echo 1 > step1.out", [], ["step1.out"], name="first"),
        sh('if [ "$ORCH_RETRY_COUNT" = 0 ]; then exit 2; fi; cat step1.out > step2.out', ["step1.out"],
           ["step2.out"], name="second"),
        sh("cat step2.out > step3.out", ["step2.out"], ["step3.out"], name="third"),
    ], retry=RetryPolicy(max_early=1))])])])
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch, Workflows(orch) as wfs:
        w = await wfs.submit(use_case_iv(1, tmp_path / "tape", tmp_path / "store", pause=0.1,
                                         reco=flaky, reco_retry=RetryPolicy(max_early=2)))
        c = await wfs.submit(chained)
        assert await w.wait(timeout=30) == "completed" and await c.wait(timeout=30) == "completed"
        reco = w.packages["1.1.1"]
        assert reco.job is not None and reco.job.info.submit_counter == 2
        assert [h["action"] for h in reco.history] == ["retry"]
        check_order(w)  # the consumers waited for the second attempt
        # The chained package resumed at binary 2: binary 1 ran once.
        assert (c.datadir / "b1.count").read_text() == "once\n" and (c.datadir / "step3.out").read_text() == "1\n"
        job = c.packages["1.1.1"].job
        assert job is not None and job.info.submit_counter == 2
        assert "binary 1 (first): finished in an earlier attempt, skipped" in (job.outputdir / "orch.log").read_text()


async def test_failed_package_stops_the_workflow_until_restarted(tmp_path: Path) -> None:
    flag = tmp_path / "fixed"
    wf = Workflow(id="w", stages=[Stage([
        Line([Package([sh(f"if [ -e {flag} ]; then echo a > a.dat; fi", [], ["a.dat"])])]),  # exit 0, no a.dat
        Line([Package([sh("cat a.dat > b.dat", ["a.dat"], ["b.dat"])])]),
    ])])
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch, Workflows(orch) as wfs:
        w = await wfs.submit(wf)
        assert await w.wait(timeout=20) == "failed"
        job = w.packages["1.1.1"].job
        assert job is not None and job.info.reason == "exit code 3 without a terminal keyword"  # missing output
        assert "INFO binary 1: output a.dat is missing" in (job.outputdir / "orch.log").read_text()
        assert w.packages["1.2.1"].state == "waiting" and w.packages["1.2.1"].job is None
        with pytest.raises(WorkflowError, match="only a failed or killed package restarts"):
            await w.restart("1.2.1")
        flag.touch()
        await w.restart("1.1.1")
        assert await w.wait(timeout=20) == "completed" and (w.datadir / "b.dat").read_text() == "a\n"


async def test_workflow_continues_after_close_and_reopen(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with Orchestrator(home=home, config=FAST) as orch, Workflows(orch) as wfs:
        w = await wfs.submit(use_case_iv(2, tmp_path / "tape", tmp_path / "store", pause=1.0))
        await until(lambda: all(w.packages[k].state == "running" for k in ("1.1.1", "1.2.1")))
        first_ids = {k: p.job.id for k, p in w.packages.items() if p.job is not None}
        assert set(first_ids) == {"1.1.1", "1.2.1"}
    await anyio.sleep(1.5)  # stage 1 ends while nobody watches; nothing else may start
    assert not any(p.name.startswith("ana") for p in (home / "workflows" / "reco001" / "data").iterdir())
    async with Orchestrator(home=home, config=FAST) as orch, Workflows(orch) as wfs:
        w = wfs["reco001"]
        assert {k: p.job.id for k, p in w.packages.items() if p.job is not None} == first_ids
        assert await w.wait(timeout=30) == "completed"
        assert len(orch.jobs) == 8 and all(p.job.info.submit_counter == 1 for p in w.packages.values())  # type: ignore
        check_order(w)
    async with Orchestrator(home=home) as orch, Workflows(orch, autorun=False) as wfs:
        assert wfs["reco001"].status == "completed"


# -------------------------------------------------------- errors at submit
async def test_submit_refuses_cycles_and_missing_producers_naming_the_file(tmp_path: Path) -> None:
    cycle = Workflow(id="c", stages=[Stage([Line([Package([sh("true", ["b.dat"], ["a.dat"])])]),
                                            Line([Package([sh("true", ["a.dat"], ["b.dat"])])])])])
    missing = Workflow(id="m", stages=[Stage([Line([Package([sh("true", [FileSpec("raw.dat", locator=str(
        tmp_path / "no-such-raw.dat"))], ["x"])])])])])
    elsewhere = Workflow(id="n", stages=[Stage([Line([Package([sh("true")], nodes=["farm01", "farm02"])])])])
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch, Workflows(orch) as wfs:
        with pytest.raises(WorkflowError, match=r"cycle through file '(a|b)\.dat'"):
            await wfs.submit(cycle)
        with pytest.raises(WorkflowError, match="'raw.dat'.*does not exist.*no-such-raw.dat") as info:
            await wfs.submit(missing)
        assert info.value.file == "raw.dat"
        with pytest.raises(WorkflowError, match="node restriction list"):
            await wfs.submit(elsewhere)
        assert len(wfs) == 0 and len(orch.jobs) == 0 and not any((orch.home / "workflows").iterdir())
        await wfs.submit(Workflow(id="ok", stages=[Stage([Line([Package([sh("true")])])])]))
        with pytest.raises(WorkflowError, match="exists"):
            await wfs.submit(Workflow(id="ok", stages=[Stage([Line([Package([sh("true")])])])]))


# ------------------------------------------------------ priority and hold
def independent(priorities: list[int], pause: float = 0.3, **kw: object) -> Workflow:
    lines = [Line([Package([sh(f"sleep {pause}; echo > p{i}.out", [], [f"p{i}.out"])], priority=p)])
             for i, p in enumerate(priorities)]
    return Workflow(stages=[Stage(lines)], **kw)  # type: ignore[arg-type]


def start_order(w: WorkflowRun) -> list[int]:
    packages = sorted(w.packages.values(), key=lambda p: p.job.info.timestamps["submitted"])  # type: ignore
    return [p.spec.priority for p in packages]


async def test_with_two_slots_packages_start_by_priority(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch, Workflows(orch) as wfs:
        w = await wfs.submit(independent([1, 5, 3, 4, 2], slots=2))
        assert sorted(p.state.replace("running", "submitted") for p in w.packages.values()) == (
            ["ready"] * 3 + ["submitted"] * 2)
        assert await w.wait(timeout=30) == "completed"
        assert start_order(w) == [5, 4, 3, 2, 1] and overlap(w) <= 2


async def test_home_slots_and_workflow_priority(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path / "home", config=config(slots=2)) as orch, Workflows(orch) as wfs:
        low = await wfs.submit(independent([0, 0, 0], pause=0.3, id="low", priority=1))  # takes both slots
        high = await wfs.submit(independent([0, 0], pause=0.3, id="high", priority=9))
        assert {p.state for p in high.packages.values()} == {"ready"}
        assert await low.wait(timeout=30) == "completed" and await high.wait(timeout=30) == "completed"
        times = {w.id: sorted(p.job.info.timestamps["submitted"] for p in w.packages.values())  # type: ignore
                 for w in (low, high)}
        assert times["high"][-1] < times["low"][-1]  # the freed slots went to the higher workflow first
        assert overlap(low) <= 2 and overlap(high) <= 2


async def test_held_workflow_and_package_start_only_when_released(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch, Workflows(orch) as wfs:
        w = await wfs.submit(independent([1, 2], pause=0.1, hold=True))
        assert await w.wait(timeout=5) == "held" and len(orch.jobs) == 0
        assert {p.state for p in w.packages.values()} == {"held"}
        wf = independent([1, 2], pause=0.1, id="pkg")
        wf.stages[0].lines[1].packages[0].hold = True
        v = await wfs.submit(wf)
        assert await v.wait(timeout=20) == "held"
        assert v.packages["1.1.1"].state == "completed" and v.packages["1.2.1"].state == "held"
        await w.release()
        await v.release("1.2.1")
        assert await w.wait(timeout=20) == "completed" and await v.wait(timeout=20) == "completed"
        await w.hold()
        assert w.hold_flag


async def test_early_start_line_runs_alongside_its_producer(tmp_path: Path) -> None:
    wf = Workflow(id="e", stages=[
        Stage([Line([Package([sh("echo part > f.dat; sleep 1; echo end >> f.dat", [], ["f.dat"])])])]),
        Stage([Line([Package([sh("cat f.dat > g.dat", ["f.dat"], ["g.dat"])])], early_start=True)]),
    ])
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch, Workflows(orch) as wfs:
        w = await wfs.submit(wf)
        assert await w.wait(timeout=20) == "completed"
        producer, consumer = w.packages["1.1.1"].job, w.packages["2.1.1"].job
        assert producer is not None and consumer is not None
        assert producer.info.timestamps["running"] <= consumer.info.timestamps["submitted"]
        assert consumer.info.timestamps["submitted"] < producer.info.timestamps["completed"]
        assert (w.datadir / "g.dat").read_text() == "part\n"


# ------------------------------------------------------------ dispositions
@pytest.mark.parametrize(("limit", "kept"), [(0, True), (1, False)])
async def test_temporary_files_stay_until_the_cache_needs_room(tmp_path: Path, limit: int, kept: bool) -> None:
    wf = Workflow(id="t", stages=[Stage([
        Line([Package([sh("echo scratch > t.tmp", [], ["t.tmp"])])]),
        Line([Package([sh("cat t.tmp > out.dat", [FileSpec("t.tmp", disposition="temporary")], ["out.dat"])])]),
    ])])
    async with Orchestrator(home=tmp_path / "home", config=config(cache_limit=limit)) as orch, Workflows(orch) as wfs:
        w = await wfs.submit(wf)
        assert await w.wait(timeout=20) == "completed"
        assert (w.datadir / "t.tmp").exists() == kept and (w.datadir / "out.dat").read_text() == "scratch\n"
        assert "t.tmp" in w.state["evictable"] and ("t.tmp" in w.state["evicted"]) != kept



async def test_a_package_job_added_just_before_a_crash_is_found_again(tmp_path: Path) -> None:
    """The job is added, then its id stored: a stop in between leaves a job that reopen adopts by name."""
    home = tmp_path / "home"
    wf = Workflow(id="a", hold=True, stages=[Stage([Line([Package([sh("echo x > x.dat", [], ["x.dat"])])])])])
    async with Orchestrator(home=home, config=FAST) as orch, Workflows(orch) as wfs:
        w = await wfs.submit(wf)
        script = w.script_path("1.1.1")
        orphan = await orch.jobs.add(Job(name="a/1.1.1", application=Executable("/bin/sh", args=[str(script)])))
    async with Orchestrator(home=home, config=FAST) as orch, Workflows(orch) as wfs:
        w = wfs["a"]
        assert w.packages["1.1.1"].job is orch.jobs[orphan.id]
        await w.release()
        assert await w.wait(timeout=20) == "completed" and len(orch.jobs) == 1
        assert (w.datadir / "x.dat").read_text() == "x\n"
    async with Orchestrator(home=home, config=FAST) as orch, Workflows(orch, autorun=False) as wfs:
        with pytest.raises(WorkflowError, match="no runner"):
            await wfs["a"].wait(timeout=1)


async def test_an_error_in_the_block_comes_out_unwrapped(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        with pytest.raises(KeyError, match="no workflow 'nope'"):
            async with Workflows(orch) as wfs:
                wfs["nope"]


async def test_acquisition_link_copy_prefetch_and_originals_are_never_deleted(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("l.dat", "c.dat", "p.dat"):
        (src / name).write_text(name)
    inputs = [FileSpec(name, locator=str(src / name), acquisition=how, disposition="deletable")
              for name, how in (("l.dat", "none"), ("c.dat", "copy"), ("p.dat", "prefetch"))]
    wf = Workflow(id="acq", hold=True, stages=[Stage([Line([Package([
        sh('[ -L l.dat ] && [ ! -L c.dat ] && cat $ORCH_INPUTS > all.dat', inputs, ["all.dat"])])])])])
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch, Workflows(orch) as wfs:
        w = await wfs.submit(wf)
        assert sorted(p.name for p in w.datadir.iterdir()) == ["p.dat"]  # prefetched at submission
        await w.release()
        assert await w.wait(timeout=20) == "completed"
        assert (w.datadir / "all.dat").read_text() == "l.datc.datp.dat"
        assert sorted(p.name for p in w.datadir.iterdir()) == ["all.dat"]
        assert sorted(p.name for p in src.iterdir()) == ["c.dat", "l.dat", "p.dat"]
