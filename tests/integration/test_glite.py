"""The ``glite`` backend against the emulated WMS running as its own process (issue 5's acceptance tests).

Each test starts ``python -m orch_glite serve`` on a free loopback port
with a private state directory, and stops it by PID afterwards (and ends any
node it left running). Real bulk: a master's subjobs go in one collection
call, status is one call per collection per tick, kill is one call.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import SocketAttribute
from orch_glite.protocol import call
from orch_glite.testing import WMSProcess
from structlog.testing import capture_logs

from orchestrator import ArgSplitter, Backend, Executable, Job, JobError, Orchestrator, RetryPolicy
from orchestrator.core.events import StatusChanged

pytestmark = pytest.mark.anyio
FAST = {"core": {"poll_interval": 0.05}}


@pytest.fixture
def wms(tmp_path: Path) -> Iterator[WMSProcess]:
    service = WMSProcess(tmp_path / "wms").start()
    try:
        yield service
    finally:
        service.stop()
        service.kill_nodes()


def glite(wms: WMSProcess, **settings: Any) -> Backend:
    return Backend("glite", endpoint=wms.endpoint, **settings)


def scan(script: str, n: int, backend: Backend, **kw: Any) -> Job:
    """``n`` subjobs of ``sh -c script i``: the script sees its subjob index as ``$0``."""
    return Job(application=Executable("/bin/sh", args=["-c", script], env=kw.pop("env", {})),
               splitter=ArgSplitter([["-c", script, str(i)] for i in range(n)]), backend=backend, **kw)


async def calls(orch: Orchestrator) -> dict[str, int]:
    """How often the glite driver called the WMS, by kind (its metrics)."""
    return (await orch.metrics())["backends"]["glite"]["driver"]["calls"]  # type: ignore[no-any-return]


@asynccontextmanager
async def recorded(orch: Orchestrator) -> AsyncIterator[dict[tuple[int, ...], list[str]]]:
    """The statuses each job goes through while the block runs (from ``orch.events()``)."""
    seen: dict[tuple[int, ...], list[str]] = {}

    async def follow() -> None:
        async for ev in orch.events():
            if isinstance(ev, StatusChanged):
                for fq in ev.ids:
                    seen.setdefault(fq, []).append(ev.new.value)

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await anyio.sleep(0.05)
        yield seen
        await anyio.sleep(0.05)
        tg.cancel_scope.cancel()


def statuses(job: Job) -> list[str]:
    return [s.status.value for s in job.subjobs]


def collection_of(job: Job) -> str:
    assert job.backend_id is not None
    return job.backend_id.split("/")[0]


def group_alive(pgid: int) -> bool:
    """Is any (non-zombie) process left in process group ``pgid``?"""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


async def until(predicate: Any, timeout: float = 20) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.02)


# ----------------------------------------------------------- 1. bulk submission
async def test_hundred_subjobs_go_in_exactly_one_collection_call(tmp_path: Path, wms: WMSProcess) -> None:
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        j = await orch.jobs.add(scan('echo "out $0"', 100, glite(wms)))
        await j.submit()
        assert (await calls(orch))["submit_collection"] == 1 and (await calls(orch))["submit_node"] == 0
        assert len(j.subjobs) == 100 and all(s.status != "new" for s in j.subjobs)
        assert len({collection_of(s) for s in j.subjobs}) == 1
        await j.wait(timeout=40)
        assert statuses(j) == ["completed"] * 100 and j.status == "completed"
        assert [(s.outputdir / "stdout").read_text() for s in j.subjobs] == [f"out {i}\n" for i in range(100)]
        assert (await calls(orch))["submit_collection"] == 1 and (await calls(orch))["submit_node"] == 0
        answer = await call(wms.endpoint, "GET", f"/v1/collections/{collection_of(j.subjobs[0])}")
    assert answer["kind"] == "collection" and len(answer["nodes"]) == 100
    assert {n["state"] for n in answer["nodes"].values()} == {"done"}


@pytest.mark.parametrize("keep_going", [True, False])
async def test_rejected_nodes_are_failed_and_keep_going_decides_raising(tmp_path: Path, wms: WMSProcess,
                                                                        keep_going: bool) -> None:
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        j = await orch.jobs.add(scan('echo "ok $0"', 6, glite(wms, reject=[1, 4])))
        if keep_going:
            await j.submit(keep_going=True)
        else:
            with pytest.raises(JobError, match="2 subjob"):
                await j.submit(keep_going=False)
        assert (await calls(orch))["submit_collection"] == 1
        # docs/design.md, native bulk: rejected subjobs are failed at once; their siblings were submitted all the same.
        assert [statuses(j)[i] for i in (1, 4)] == ["failed", "failed"]
        assert all(statuses(j)[i] in ("submitted", "running", "completed") for i in (0, 2, 3, 5))
        assert "rejected by the WMS" in (j.subjobs[1].info.reason or "")
        assert j.subjobs[1].backend_id is None
        await j.wait(timeout=30)
        assert statuses(j) == ["completed", "failed", "completed", "completed", "failed", "completed"]
        assert j.status == "failed"


@pytest.mark.parametrize("keep_going", [True, False])
async def test_every_node_rejected_fails_every_subjob(tmp_path: Path, wms: WMSProcess, keep_going: bool) -> None:
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        j = await orch.jobs.add(scan("true", 3, glite(wms, reject=[0, 1, 2])))
        if keep_going:
            await j.submit(keep_going=True)
        else:
            with pytest.raises(JobError):
                await j.submit(keep_going=False)
        # Native bulk: rejected subjobs are failed, not left new, so the master is not rolled back.
        assert statuses(j) == ["failed"] * 3 and j.status == "failed"


async def test_aborted_nodes_go_submitted_then_failed(tmp_path: Path, wms: WMSProcess) -> None:
    script = 'case "$0" in 1|2) sleep 30 ;; esac; echo "ok $0"'
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        j = await orch.jobs.add(scan(script, 4, glite(wms, abort={1: 0.5, 2: 0.8}),
                                     retry=RetryPolicy(max_late_unhandled=0)))
        async with recorded(orch) as seen:
            await j.submit()
            assert all(s in ("submitted", "running", "completed") for s in statuses(j))
            await j.wait(timeout=30)
        assert statuses(j) == ["completed", "failed", "failed", "completed"] and j.status == "failed"
        for i in (1, 2):
            sub = j.subjobs[i]
            path = seen[sub.fqid_tuple]
            assert path[0] == "submitting" and path.index("submitted") < path.index("failed") and path[-1] == "failed"
            assert sub.info.timestamps["submitted"] < sub.info.timestamps["failed"]
            last = sub.info.history[-1]
            assert last["level"] == "backend" and last["verdict"] == "late_unhandled"
            assert "aborted" in last["reason"]
        answer = await call(wms.endpoint, "GET", f"/v1/collections/{collection_of(j.subjobs[1])}")
    pids = [n["pid"] for n in answer["nodes"].values() if n["state"] == "aborted"]
    assert len(pids) == 2
    await until(lambda: not any(group_alive(p) for p in pids if p))  # the WMS ended the aborted nodes


# ------------------------------------------------- 2. single-subjob resubmission
async def test_subjob_resubmitted_alone_is_a_one_node_submission(tmp_path: Path, wms: WMSProcess) -> None:
    script = 'if [ "$0" = 2 ] && [ "$ORCH_RETRY_COUNT" = 0 ]; then exit 3; fi; echo "ok $0 $ORCH_RETRY_COUNT"'
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        j = await orch.jobs.add(scan(script, 4, glite(wms)))
        await j.submit()
        await j.wait(timeout=30)
        assert statuses(j) == ["completed", "completed", "failed", "completed"] and j.status == "failed"
        original = collection_of(j.subjobs[0])
        async with recorded(orch) as seen:
            await j.subjobs[2].resubmit()
            assert (await calls(orch))["submit_collection"] == 1 and (await calls(orch))["submit_node"] == 1
            alone = collection_of(j.subjobs[2])
            assert alone != original and {collection_of(j.subjobs[i]) for i in (0, 1, 3)} == {original}
            await j.wait(timeout=30)
        assert statuses(j) == ["completed"] * 4 and j.status == "completed"
        assert (j.subjobs[2].outputdir / "stdout").read_text() == "ok 2 1\n"
        master = seen[j.fqid_tuple]
        assert master[0] == "submitted" and master[-1] == "completed"  # failed -> submitted -> ... -> completed
        single = await call(wms.endpoint, "GET", f"/v1/collections/{alone}")
        bulk = await call(wms.endpoint, "GET", f"/v1/collections/{original}")
    assert single["kind"] == "node" and len(single["nodes"]) == 1
    assert bulk["kind"] == "collection" and len(bulk["nodes"]) == 4  # the first attempt of subjob 2 stays there
    assert sorted(n["exit_code"] for n in bulk["nodes"].values()) == [0, 0, 0, 3]


async def test_bulk_kill_reaches_collection_nodes_and_lone_nodes(tmp_path: Path, wms: WMSProcess) -> None:
    script = 'if [ "$0" = 1 ] && [ "$ORCH_RETRY_COUNT" = 0 ]; then exit 3; fi; exec sleep 60'
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        j = await orch.jobs.add(scan(script, 4, glite(wms)))
        await j.submit()
        await until(lambda: statuses(j) == ["running", "failed", "running", "running"])
        await j.subjobs[1].resubmit()
        await until(lambda: j.subjobs[1].status == "running")
        assert j.status == "running"
        assert (await calls(orch))["submit_node"] == 1 and len({collection_of(s) for s in j.subjobs}) == 2
        cancels = (await calls(orch))["cancel"]
        await j.kill()
        assert (await calls(orch))["cancel"] == cancels + 1  # one call for both kinds
        assert statuses(j) == ["killed"] * 4 and j.status == "killed"
        collections = {collection_of(s) for s in j.subjobs}
        answers = [await call(wms.endpoint, "GET", f"/v1/collections/{c}") for c in collections]
    nodes = {n["key"]: n for a in answers for n in a["nodes"].values()}
    live = [n for n in nodes.values() if n["exit_code"] != 3]
    assert len(live) == 4 and {n["state"] for n in live} == {"cancelled"}
    await until(lambda: not any(group_alive(n["pid"]) for n in live))


# ------------------------------------------------------- 3. one call per tick
async def test_status_is_one_call_per_collection_per_tick_and_kill_one_call(tmp_path: Path, wms: WMSProcess) -> None:
    script = 'if [ "$0" = 0 ] && [ "$ORCH_RETRY_COUNT" = 0 ]; then exit 3; fi; exec sleep 60'
    slow = {"core": {"poll_interval": 3600}}  # no monitoring ticks but the ones this test makes
    async with Orchestrator(home=tmp_path / "home", config=slow) as orch:
        j = await orch.jobs.add(scan(script, 10, glite(wms)))
        await j.submit()
        assert (await calls(orch))["status"] == 0
        ticks = 0
        with anyio.fail_after(20):
            while statuses(j) != ["failed"] + ["running"] * 9:
                before = (await calls(orch))["status"]
                await orch.refresh()
                assert (await calls(orch))["status"] == before + 1  # the whole collection in one call
                ticks += 1
                await anyio.sleep(0.05)
        assert ticks >= 1
        await j.subjobs[0].resubmit()
        with anyio.fail_after(20):
            while j.subjobs[0].status != "running":
                before = (await calls(orch))["status"]
                await orch.refresh()
                assert (await calls(orch))["status"] == before + 2  # two collections: the original, the lone node
                await anyio.sleep(0.05)
        await j.kill()
        assert (await calls(orch))["cancel"] == 1
        assert statuses(j) == ["killed"] * 10


# -------------------------------------------------- 4. the WMS killed mid-run
async def test_wms_killed_and_restarted_mid_run_loses_nothing_and_runs_nothing_twice(
        tmp_path: Path) -> None:
    side = tmp_path / "side"
    script = 'echo "$0" >> "$SIDE"; sleep 1; echo "ok $0"'
    n = 18
    service = WMSProcess(tmp_path / "wms", max_running=6).start()
    try:
        with capture_logs() as logs:
            async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
                j = await orch.jobs.add(scan(script, n, glite(service), env={"SIDE": str(side)}))
                await j.submit()
                await until(lambda: "running" in statuses(j))
                first = service.pid
                service.kill(signal.SIGKILL)
                await anyio.sleep(1.0)  # status calls fail meanwhile; nodes go on; queued nodes wait
                assert all(s != "failed" for s in statuses(j))
                await service.astart()  # same port, same state directory
                assert service.pid != first
                await j.wait(timeout=40)
                assert statuses(j) == ["completed"] * n, [s.info.reason for s in j.subjobs]
                assert [(s.outputdir / "stdout").read_text() for s in j.subjobs] == [f"ok {i}\n" for i in range(n)]
                assert (await calls(orch))["submit_collection"] == 1
                answer = await call(service.endpoint, "GET", f"/v1/collections/{collection_of(j.subjobs[0])}")
        assert sorted(side.read_text().split(), key=int) == [str(i) for i in range(n)]  # each ran exactly once
        loaded = [e for e in service.log_events() if e.get("event") == "state loaded"]
        assert len(loaded) == 1 and loaded[0]["queued"] > 0  # it was killed mid-run, with nodes still to start
        assert len(answer["nodes"]) == n and {v["state"] for v in answer["nodes"].values()} == {"done"}
        failed = [e for e in logs if e["event"] == "WMS status query failed"]
        assert failed and all(e["fqid"] == str(j.id) and f"{j.id}.0" in e["runs"] for e in failed)
    finally:
        service.stop()
        service.kill_nodes()


# ------------------------------------------------ 5. garbage and dropped answers
async def test_garbage_and_dropped_status_answers_are_backend_faults(tmp_path: Path, wms: WMSProcess) -> None:
    backend = glite(wms, drop={"status": 2}, garbage={"status": 2})
    with capture_logs() as logs:
        async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
            j = await orch.jobs.add(scan('echo "ok $0"', 5, backend))
            await j.submit()
            await j.wait(timeout=30)
            assert statuses(j) == ["completed"] * 5 and j.status == "completed"
            assert (await calls(orch))["status"] >= 5
            assert all(not s.info.history for s in j.subjobs)  # nothing was blamed on the jobs
    failed = [e for e in logs if e["event"] == "WMS status query failed"]
    errors = " ".join(e["error"] for e in failed)
    assert len(failed) == 4 and "without an answer" in errors and "not JSON" in errors
    assert all(e["fqid"] == str(j.id) and sorted(e["runs"]) == [f"{j.id}.{i}" for i in range(5)] for e in failed)
    assert any(e["event"] == "status query failed" and e["log_level"] == "warning" for e in logs)  # the core's


async def test_lost_submission_answers_are_retried_without_running_anything_twice(tmp_path: Path,
                                                                                   wms: WMSProcess) -> None:
    side = tmp_path / "side"
    backend = glite(wms, drop={"submit": 1, "cancel": 1}, garbage={"submit": 1})
    with capture_logs() as logs:
        async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
            j = await orch.jobs.add(scan('echo "$0" >> "$SIDE"; exec sleep 60', 4, backend,
                                         env={"SIDE": str(side)}))
            await j.submit()
            assert (await calls(orch))["submit_collection"] == 3  # dropped, garbled, answered: one request
            await until(lambda: statuses(j) == ["running"] * 4)
            await j.kill()
            assert (await calls(orch))["cancel"] == 2 and statuses(j) == ["killed"] * 4
    assert sorted(side.read_text().split()) == ["0", "1", "2", "3"]
    retried = [e for e in logs if e["event"] == "WMS call failed, retrying with the same request id"]
    assert [e["request"] for e in retried] == ["submit_collection", "submit_collection", "cancel"]
    assert all(e["fqid"] == str(j.id) for e in retried)
    state = await call(wms.endpoint, "GET", "/v1/ping")
    assert state["nodes"] == 4  # one collection's worth: nothing was created twice


async def test_slow_then_garbled_service_recovers_without_failing_jobs(tmp_path: Path, wms: WMSProcess) -> None:
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        j = await orch.jobs.add(scan('sleep 0.5; echo "ok $0"', 3, glite(wms, timeout=0.3)))
        with capture_logs() as logs:
            await call(wms.endpoint, "PUT", "/v1/faults", {"status_delay": 1.0})  # longer than the driver waits
            await j.submit()
            await until(lambda: sum(e["event"] == "WMS status query failed" for e in logs) >= 2)
            await call(wms.endpoint, "PUT", "/v1/faults", {"garbage": {"status": 1}})
            await until(lambda: sum("not JSON" in e.get("error", "") for e in logs) >= 1)
            await call(wms.endpoint, "PUT", "/v1/faults", {})
            await j.wait(timeout=30)
        assert statuses(j) == ["completed"] * 3
    timeouts = [e for e in logs if e["event"] == "WMS status query failed" and "within 0.3 s" in e["error"]]
    assert timeouts and all(e["fqid"] == str(j.id) for e in timeouts)
    assert (await call(wms.endpoint, "GET", "/v1/ping"))["service"] == "orch-glite-wms"  # the service is still up


async def test_unreachable_wms_at_submission_leaves_the_master_new(tmp_path: Path) -> None:
    with anyio.fail_after(10):
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        port = listener.extra(SocketAttribute.local_port)
        await listener.aclose()  # nothing listens there now
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        j = await orch.jobs.add(scan("true", 3, Backend("glite", endpoint=f"http://127.0.0.1:{port}", retries=1)))
        with capture_logs() as logs, pytest.raises(JobError, match="no subjob could be submitted"):
            await j.submit(keep_going=True)
        assert j.status == "new" and j.subjobs == []
        assert (await calls(orch))["submit_collection"] == 2
    failed = [e for e in logs if e["event"] == "WMS collection submission failed"]
    assert len(failed) == 1 and failed[0]["fqid"] == str(j.id)


async def test_settings_are_validated_naming_the_field(tmp_path: Path) -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({"endpoint": "http://10.1.2.3:80"}, "endpoint"), ({"endpoint": "https://127.0.0.1:1"}, "endpoint"),
        ({"endpoint": "http://127.0.0.1"}, "endpoint"), ({"reject": "1"}, "reject"), ({"reject": [-1]}, "reject"),
        ({"abort": [1]}, "abort"), ({"abort": {"x": 1}}, "abort"), ({"abort": {1: -2}}, "abort"),
        ({"status_delay": "slow"}, "status_delay"), ({"drop": {"everything": 1}}, "drop"),
        ({"garbage": {"status": -1}}, "garbage"), ({"timeout": 0}, "timeout"), ({"retries": 99}, "retries"),
        ({"colour": "red"}, "colour"), ({"shell": "sh"}, "shell"),
    ]
    async with Orchestrator(home=tmp_path) as orch:
        for settings, field in bad:
            with pytest.raises(JobError) as info:
                await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("glite", **settings)))
            assert info.value.field == f"backend.{field}", settings
        ok = await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend(
            "glite", endpoint="http://127.0.0.1:9", reject=(3, 1), abort={2: 1}, drop={"status": 1}, timeout=2)))
        assert ok.backend.settings == {"endpoint": "http://127.0.0.1:9", "reject": [1, 3], "abort": {"2": 1.0},
                                       "drop": {"status": 1}, "timeout": 2.0}
        assert len(orch.jobs.select()) == 1
