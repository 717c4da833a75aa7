"""Partitioned jobs on the local backend: weighted StepSplitter, pre-job, subjobs, aggregator (DataGrid 5-6)."""

from __future__ import annotations

import itertools
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest

import orchestrator.checkpoint as checkpoint_module
from orchestrator import Executable, Job, JobError, Orchestrator, StepSplitter
from orchestrator.checkpoint import Steps

pytestmark = pytest.mark.anyio
FAST: dict[str, Any] = {"core": {"poll_interval": 0.05}}
STATE_PY = str(Path(checkpoint_module.__file__))

SUBJOB = '''
import os, sys
from checkpoint import State
if not os.path.exists(os.environ["READY"]):
    sys.exit("the prejob has not run")
state = State()
total = state.get_int_value("sum") or 0
count = state.get_int_value("count") or 0
while (step := state.get_next_step()) is not None:
    total += int(step) % 1000
    count += 1
    if count % 5000 == 0:
        state.save_value("sum", total)
        state.save_value("count", count)
        state.save_state()
state.save_value("sum", total)
state.save_value("count", count)
state.set_final_state()
state.save_state()
'''

#: The seed's aggregator example (DataGrid 5.2): load each subjob's final state by label and add them up.
AGGREGATOR = '''
import sys
from checkpoint import State
agg = State()
total = count = 0
while (label := agg.get_next_step()) is not None:
    sub = agg.load_state(label)
    if not sub.is_final_state():
        sys.exit(f"Error: sub-job state {label} is not final")
    total += sub.get_int_value("sum")
    count += sub.get_int_value("count")
print(total, count)
'''


def weights_for(n: int) -> list[int]:
    """Uneven: a noisy baseline, a heavy block and a few spikes."""
    rng = random.Random(11)
    w = [1 + rng.randrange(20) for _ in range(n)]
    for i in range(40_000, 43_000):
        w[i] = 300
    for i in rng.sample(range(n), 40):
        w[i] = 50_000
    return w


def dp_optimum(weights: Sequence[int], m: int) -> int:
    """The optimal largest part of a contiguous m-partition, by dynamic programming.

    f[k][j] = min over i of max(f[k-1][i], S[j] - S[i]); for each j the best i
    only moves right as j grows (the max of a rising and a falling function),
    so each layer is one sweep: O(m n).
    """
    n = len(weights)
    prefix = list(itertools.accumulate(weights, initial=0))
    f = prefix[:]  # one part: everything up to j
    for k in range(2, min(m, n) + 1):
        g = [0] * (n + 1)
        i = k - 1
        for j in range(k, n + 1):
            i = max(i, k - 1)
            while i + 1 <= j - 1 and max(f[i + 1], prefix[j] - prefix[i + 1]) <= max(f[i], prefix[j] - prefix[i]):
                i += 1
            g[j] = max(f[i], prefix[j] - prefix[i])
        f = g
    return f[n]


def test_the_dp_reference_agrees_with_brute_force() -> None:
    rng = random.Random(3)
    for _ in range(200):
        n, m = rng.randint(1, 9), rng.randint(1, 4)
        w = [rng.randrange(10) for _ in range(n)]
        brute = min(max(sum(w[a:b]) for a, b in itertools.pairwise((0, *cuts, n)))
                    for cuts in itertools.combinations(range(1, n), min(m, n) - 1))
        assert dp_optimum(w, m) == brute


def sh_job(script: str, **kw: Any) -> Job:
    return Job(application=Executable("/bin/sh", ["-c", script]), backend="local", **kw)


async def test_weighted_partition_prejob_subjobs_and_aggregator(tmp_path: Path) -> None:
    """Acceptance 2: 100,000 unevenly weighted steps in 8 subjobs whose largest weight is the optimum of
    the contiguous partition; the pre-job runs first; the aggregator adds up the subjobs' final states."""
    n = 100_000
    weights = weights_for(n)
    (tmp_path / "sub.py").write_text(SUBJOB)
    (tmp_path / "agg.py").write_text(AGGREGATOR)
    ready = tmp_path / "ready"
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        master = await orch.jobs.add(Job(
            name="sum", application=Executable(sys.executable, ["sub.py"], env={"READY": str(ready)}),
            inputfiles=[str(tmp_path / "sub.py"), STATE_PY], backend="local",
            steps=f"1..{n}", step_weights=weights, splitter=StepSplitter(8),
            prejob=sh_job(f"sleep 0.3; touch {ready}"),
            aggregator=Job(application=Executable(sys.executable, ["agg.py"]),
                           inputfiles=[str(tmp_path / "agg.py"), STATE_PY])))
        await master.submit()
        assert len(master.subjobs) == 8 and master.status in ("submitted", "running")  # as its pre-job is
        assert all(s.status == "new" for s in master.subjobs)  # waiting for the pre-job
        prejob = cast(Job, master.prejob)
        assert prejob is not None and prejob.id == 1 and prejob.info.partition == {"master": 0, "role": "prejob"}
        await master.wait(timeout=60)

        assert prejob.status == "completed"
        assert master.status == "completed", (master.info.reason, [s.info.reason for s in master.subjobs])
        # The partition: contiguous, covering every step once, its largest weight the optimum.
        parts = [Steps(s.steps).range for s in master.subjobs]
        assert parts[0] is not None and parts[0][0] == 1 and parts[-1] is not None and parts[-1][1] == n
        assert all(a is not None and b is not None and a[1] + 1 == b[0] for a, b in itertools.pairwise(parts))
        largest = max(sum(weights[a - 1:b]) for a, b in parts)  # type: ignore[misc]
        assert largest == dp_optimum(weights, 8)
        # The pre-job ended before any subjob was submitted.
        first_submit = min(s.info.timestamps["submitting"] for s in master.subjobs)
        assert prejob.info.timestamps["completed"] <= first_submit
        # The aggregator: a top-level job of its own, its steps the final states' labels.
        aggregator = cast(Job, master.aggregator)
        assert aggregator is not None and aggregator is orch.jobs[2] and aggregator.status == "completed"
        assert aggregator.steps == [s.info.checkpoint["label"] for s in master.subjobs]
        assert all(label.startswith(f"0.{i}:") for i, label in enumerate(aggregator.steps))
        expected = sum(step % 1000 for step in range(1, n + 1))
        assert (aggregator.outputdir / "stdout").read_text() == f"{expected} {n}\n"


async def test_a_failed_prejob_fails_the_master_and_starts_no_subjob(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        flag = tmp_path / "second-time"  # the pre-job fails the first time, and succeeds once resubmitted
        master = await orch.jobs.add(sh_job("exit 0", steps="1..4", splitter=StepSplitter(2),
                                            prejob=sh_job(f'if [ -e {flag} ]; then exit 0; fi; touch {flag}; '
                                                          'echo broken >&2; exit 3')))
        await master.submit()
        await master.wait(timeout=30)
        prejob = cast(Job, master.prejob)
        assert master.status == "failed" and prejob is not None and prejob.status == "failed"
        assert [s.status.value for s in master.subjobs] == ["new", "new"]
        assert all(s.info.submit_counter == 0 for s in master.subjobs)
        assert "prejob 1 failed" in (master.info.reason or "") and "no subjob was started" in (master.info.reason or "")
        with pytest.raises(JobError, match="resubmit the prejob"):
            await master.resubmit()
        # Resubmitting the pre-job starts its phase again; the subjobs run once it completes.
        await cast(Job, master.prejob).resubmit()
        await master.wait(timeout=30)
        assert master.status == "completed" and [s.status.value for s in master.subjobs] == ["completed"] * 2


SUB_SH = ('s=$($ORCH_STATE next-step); $ORCH_STATE save-value v "$s"; '
          'if [ "$s" != 3 ]; then $ORCH_STATE final; fi; $ORCH_STATE save >/dev/null')
AGG_SH = ('while l=$($ORCH_STATE next-step); do $ORCH_STATE is-final "$l" || exit 1; '
          'echo "$l $($ORCH_STATE get v "$l")"; done')


@pytest.mark.parametrize("min_success", [1.0, 0.75])
async def test_min_success_decides_whether_the_aggregator_starts(tmp_path: Path, min_success: float) -> None:
    """Subjob 2 ends without a final state: with min_success=1 no aggregator and the master fails with the
    reason; with 0.75 the aggregator (in shell, loading states by label) gets the three final ones."""
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        master = await orch.jobs.add(sh_job(SUB_SH, steps="1..4", splitter=StepSplitter(4), min_success=min_success,
                                            aggregator=sh_job(AGG_SH)))
        await master.submit()
        await master.wait(timeout=30)
        assert [s.status.value for s in master.subjobs] == ["completed"] * 4
        if min_success == 1.0:
            assert master.status == "failed" and "aggregator" not in master.info.partition
            assert master.info.reason == ("only 3 of 4 subjobs reached a final state (min_success=1); "
                                          "the aggregator was not started")
            assert len(orch.jobs) == 1
        else:
            aggregator = cast(Job, master.aggregator)
            assert master.status == "completed" and aggregator is not None and aggregator.status == "completed"
            assert (aggregator.outputdir / "stdout").read_text().splitlines() == ["0.0:1 1", "0.1:1 2", "0.3:1 4"]


async def test_a_failing_aggregator_fails_the_master_and_a_rerun_can_fix_it(tmp_path: Path) -> None:
    flag = tmp_path / "fixed"
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        master = await orch.jobs.add(sh_job(SUB_SH.replace('!= 3', '!= 0'), steps="1..2", splitter=StepSplitter(2),
                                            aggregator=sh_job(f"test -e {flag}")))
        await master.submit()
        await master.wait(timeout=30)
        assert master.status == "failed" and "aggregator 1 failed" in (master.info.reason or "")
        flag.touch()
        assert master.aggregator is not None
        await cast(Job, master.aggregator).resubmit()
        await master.wait(timeout=30)
        assert master.status == "completed" and master.info.reason is None


async def test_reopen_while_the_prejob_runs_carries_the_phases_on(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with Orchestrator(home=home, config=FAST) as orch:
        master = await orch.jobs.add(sh_job(SUB_SH.replace('!= 3', '!= 0'), steps="1..3", splitter=StepSplitter(3),
                                            prejob=sh_job("sleep 1"), aggregator=sh_job(AGG_SH)))
        await master.submit()
        assert master.status == "submitted"
    async with Orchestrator(home=home, config=FAST) as orch:
        master = orch.jobs[0]
        assert master.status in ("submitted", "running") and master.is_active()
        await master.wait(timeout=30)
        assert master.status == "completed" and master.aggregator is not None
        assert (master.aggregator.outputdir / "stdout").read_text().splitlines() == ["0.0:1 1", "0.1:1 2", "0.2:1 3"]


async def test_killing_the_master_kills_its_prejob(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        master = await orch.jobs.add(sh_job("true", steps="1..2", splitter=StepSplitter(2),
                                            prejob=sh_job("sleep 30")))
        await master.submit()
        await master.kill()
        await master.wait(timeout=30)
        assert master.prejob is not None and cast(Job, master.prejob).status == "killed"
        assert master.status == "failed" and "prejob 1 killed" in (master.info.reason or "")


async def test_bad_partition_definitions_are_refused_at_add(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        cases: list[tuple[dict[str, Any], str]] = [
            (dict(steps="9..1"), "steps"),
            (dict(steps="1..3", step_weights=[1, 2]), "step_weights"),
            (dict(step_weights=[1]), "step_weights"),
            (dict(steps="1..2", prejob=sh_job("true")), "prejob"),
            (dict(steps="1..2", splitter=StepSplitter(), aggregator=sh_job("true", splitter=StepSplitter(1))),
             "aggregator"),
            (dict(steps="1..2", splitter=StepSplitter(), min_success=2), "min_success"),
        ]
        for kw, field in cases:
            with pytest.raises(JobError, match=rf"\[field {field}\]"):
                await orch.jobs.add(sh_job("true", **kw))
        assert len(orch.jobs) == 0


async def test_step_splitter_defaults_to_the_backends_free_slots(tmp_path: Path) -> None:
    config = {**FAST, "backends": {"local": {"max_running": 3}}}
    async with Orchestrator(home=tmp_path / "home", config=config) as orch:
        on_local = await orch.jobs.add(sh_job("true", steps="1..10", splitter=StepSplitter()))
        await on_local.submit()
        on_sim = await orch.jobs.add(Job(application=Executable("/bin/true"), steps="1..10", splitter=StepSplitter(),
                                         backend="sim"))
        await on_sim.submit()  # sim has no max_running: checkpoint.default_partitions
        assert len(on_local.subjobs) == 3 and len(on_sim.subjobs) == 4
        await on_local.wait(timeout=30)
        await on_sim.wait(timeout=30)
        assert [s.steps for s in on_local.subjobs] == ["1..4", "5..7", "8..10"]


async def test_resubmitted_subjobs_run_the_aggregator_again_with_their_new_final_states(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    sub = (f's=$($ORCH_STATE next-step); $ORCH_STATE save-value v "$s"; '
           f'if [ "$s" != 2 ] || [ -e {flag} ]; then $ORCH_STATE final; fi; $ORCH_STATE save >/dev/null')
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        master = await orch.jobs.add(sh_job(sub, steps="1..2", splitter=StepSplitter(2), aggregator=sh_job(AGG_SH)))
        await master.submit()
        await master.wait(timeout=30)
        assert master.status == "failed" and "only 1 of 2" in (master.info.reason or "")
        flag.touch()
        await master.subjobs[1].resubmit()  # from its initial state (state 2); its final save is state 3
        await master.wait(timeout=30)
        aggregator = cast(Job, master.aggregator)
        assert master.status == "completed" and master.info.reason is None and aggregator is not None
        assert (aggregator.outputdir / "stdout").read_text().splitlines() == ["0.0:1 1", "0.1:3 2"]
        await master.subjobs[0].resubmit()
        await master.wait(timeout=30)
        assert master.status == "completed" and aggregator.info.submit_counter == 2
        assert (aggregator.outputdir / "stdout").read_text().splitlines() == ["0.0:3 1", "0.1:3 2"]
