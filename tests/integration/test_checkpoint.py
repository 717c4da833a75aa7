"""Checkpointing acceptance tests on the local backend: resume after a node crash, shell/Python states
through the wrapper, the states kept and resubmission from one, the restart counter."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner

import orchestrator.checkpoint as checkpoint_module
from orchestrator import Executable, Job, Orchestrator
from orchestrator.checkpoint import State
from orchestrator.cli import cli
from orchestrator.runtime.repository import StateRow

FAST: dict[str, Any] = {"core": {"poll_interval": 0.05}}
STATE_PY = Path(checkpoint_module.__file__)

#: The seed's collision-sum example (DataGrid 4.4), with the State API as a lone module on the worker.
COLLISIONS = '''
import os, time
from checkpoint import State

def collisions(event):
    return (event * 7919) % 13

state = State()
total = state.get_int_value("collision") or 0
first = None
while (event := state.get_next_step()) is not None:
    if first is None:
        first = event
        with open(os.environ["STARTS"], "a") as f:
            f.write(f"{os.environ['ORCH_RETRY_COUNT']} {event}\\n")
    total += collisions(int(event))
    state.save_value("collision", total)
    state.save_value("events", (state.get_int_value("events") or 0) + 1)
    state.save_state()
    time.sleep(0.002)
state.set_final_state()
state.save_state()
print(total)
'''


def app(tmp_path: Path, name: str, code: str) -> Path:
    path = tmp_path / name
    path.write_text(code)
    return path


def python_job(tmp_path: Path, name: str, code: str, **kw: Any) -> Job:
    script = app(tmp_path, name, code)
    return Job(application=Executable(sys.executable, [name], env=kw.pop("env", {})),
               inputfiles=[str(script), str(STATE_PY)], backend="local", **kw)


async def newest(orch: Orchestrator, job: Job) -> State:
    rows = await job.states()
    return State.from_text(rows[-1]["data"])


@pytest.mark.anyio
async def test_collision_sum_resumes_after_a_node_crash(tmp_path: Path) -> None:
    """Acceptance 1: killed with SIGKILL mid-way (the wrapper's whole process group), it resumes from
    its last saved step; the sum equals the uninterrupted one and no step is counted twice."""
    starts = tmp_path / "starts"
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        job = await orch.jobs.add(python_job(tmp_path, "collisions.py", COLLISIONS, steps="1..2000",
                                             env={"STARTS": str(starts)}))
        await job.submit()
        assert [f"{r['job']}:{r['seq']}" for r in await job.states()] == ["0:0"]  # from submission on
        with anyio.fail_after(30):
            while job.info.checkpoint.get("seq", 0) < 300:  # harvested on the monitoring ticks
                await anyio.sleep(0.02)
        pid = int((job.outputdir / f"orch.{job.info.submit_counter}.log").read_text().split()[2])  # the attempt's log
        os.killpg(pid, signal.SIGKILL)  # the node crashes: wrapper and application die at once
        await job.wait(timeout=60)
        assert job.status == "completed", job.info.history
        crash = job.info.history[0]
        assert crash["level"] == "worker" and crash["action"] == "retry" and crash["restart"] == 1
        resumed_from = int(crash["state"].split(":")[1])
        assert 300 <= resumed_from < 2000
        # The state after step s is state number s: the second run starts right after the one resumed from.
        assert starts.read_text().splitlines() == ["0 1", f"1 {resumed_from + 1}"]
        final = await newest(orch, job)
        expected = sum((event * 7919) % 13 for event in range(1, 2001))
        assert final.final and final.get_int_value("collision") == expected
        assert final.get_int_value("events") == 2000  # every step counted exactly once
        assert (job.outputdir / "stdout").read_text() == f"{expected}\n"
        assert job.info.submit_counter == 2


@pytest.mark.anyio
async def test_shell_and_python_states_through_the_wrapper(tmp_path: Path) -> None:
    """Acceptance 3 in a real job: $ORCH_STATE and the Python State API hand states to each other."""
    reader = ('from checkpoint import State\n'
              's = State()\n'
              'assert s.get_string_value("greeting") == "tab\\there\\nnext line", s.values\n'
              'assert s.current_step == "alpha" and s.get_next_step() == "beta two"\n'
              's.save_value("from_python", "x\\\\y z")\n'
              'print(s.save_state())\n')
    app(tmp_path, "reader.py", reader)
    script = ('set -e\n'
              '$ORCH_STATE save-value greeting "$(printf "tab\\there\\nnext line")"\n'
              '$ORCH_STATE next-step\n'
              '$ORCH_STATE save\n'
              '"$PY" reader.py\n'
              '$ORCH_STATE get from_python\n'
              '$ORCH_STATE step\n'
              '$ORCH_STATE next-step\n'
              '$ORCH_STATE final\n'
              '$ORCH_STATE save\n')
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        job = await orch.jobs.add(Job(application=Executable("/bin/sh", ["-c", script], env={"PY": sys.executable}),
                                      inputfiles=[str(tmp_path / "reader.py"), str(STATE_PY)],
                                      steps=["alpha", "beta two", "gamma"]))
        await job.submit()
        await job.wait(timeout=30)
        assert job.status == "completed", (job.outputdir / "stderr").read_text()
        assert (job.outputdir / "stdout").read_text().splitlines() == [
            "alpha", "0:1", "0:2", "x\\y z", "beta two", "gamma", "0:3"]
        final = await newest(orch, job)
        assert final.label == "0:3" and final.final and final.get_string_value("from_python") == "x\\y z"
        assert final.get_string_value("greeting") == "tab\there\nnext line"


STEPPER = '''
import os
from checkpoint import State
state = State()
with open(os.environ["STARTS"], "a") as f:
    f.write(f"{state.position + 1}\\n")
while (step := state.get_next_step()) is not None:
    state.save_value("done", step)
    state.save_state()
state.set_final_state()
state.save_state()
'''


def test_last_n_states_kept_back_and_resubmit_from_state(tmp_path: Path) -> None:
    """Acceptance 4: only the last n states are kept; `--back 2` fetches the right one; resubmitting
    from that file restarts from it (through the command line)."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text("[core]\npoll_interval = 0.05\n[checkpoint]\nstates_kept = 3\n")
    starts = tmp_path / "starts"
    anyio.run(_run_stepper, tmp_path, home, starts)
    _fetch_and_resubmit(tmp_path, home, starts)
    anyio.run(_after_resubmit, home, starts)


async def _run_stepper(tmp_path: Path, home: Path, starts: Path) -> None:
    async with Orchestrator(home=home) as orch:
        job = await orch.jobs.add(python_job(tmp_path, "stepper.py", STEPPER, steps="1..6",
                                             env={"STARTS": str(starts)}))
        await job.submit()
        await job.wait(timeout=30)
        assert job.status == "completed"
        # Steps 1..6 saved states 1..6 and the final one is 7: 5, 6 and 7 are kept, here and in the work dir.
        assert [f"{r['job']}:{r['seq']}" for r in await job.states()] == ["0:5", "0:6", "0:7"]
        workdir = job.workspace / "work" / ".orch-state"
        assert sorted(p.name for p in workdir.glob("*.state")) == ["5.state", "6.state", "7.state"]


def _fetch_and_resubmit(tmp_path: Path, home: Path, starts: Path) -> None:
    runner = CliRunner()
    listing = runner.invoke(cli, ["--home", str(home), "checkpoint", "list", "0"])
    assert listing.exit_code == 0, listing.output
    rows = [line.split() for line in listing.output.splitlines() if line.strip()]
    assert rows[0][0] == "label"
    assert [row[0] for row in rows[1:]] == ["0:5", "0:6", "0:7"]  # the label column (a time may read "00:48")
    last = runner.invoke(cli, ["--home", str(home), "checkpoint", "get", "0"])
    assert State.from_text(last.output).label == "0:7" and State.from_text(last.output).final
    saved = tmp_path / "state-5"
    got = runner.invoke(cli, ["--home", str(home), "checkpoint", "get", "0", "--back", "2", "-o", str(saved)])
    assert got.exit_code == 0, got.output
    back2 = State.from_text(saved.read_text())
    assert back2.label == "0:5" and back2.get_string_value("done") == "5" and not back2.final
    too_far = runner.invoke(cli, ["--home", str(home), "checkpoint", "get", "0", "--back", "3"])
    assert too_far.exit_code == 2 and "goes past the oldest" in too_far.output

    again = runner.invoke(cli, ["--home", str(home), "resubmit", "0", "--from-state", str(saved)])
    assert again.exit_code == 0, again.output
    assert runner.invoke(cli, ["--home", str(home), "wait", "0", "--timeout", "30"]).exit_code == 0
    assert starts.read_text().splitlines() == ["1", "6"]  # the second run went on after step 5


async def _after_resubmit(home: Path, starts: Path) -> None:
    async with Orchestrator(home=home, config=FAST) as orch:
        job = orch.jobs[0]
        rows = [StateRow(**r) for r in await job.states()]
        # The adopted state became state 8 (the newest), then step 6 and the final save: 9 and 10.
        assert [r.label for r in rows] == ["0:8", "0:9", "0:10"]
        assert State.from_text(rows[0].data).get_string_value("done") == "5"
        assert State.from_text(rows[-1].data).final
        await job.resubmit()  # a plain resubmission starts from the beginning again
        await job.wait(timeout=30)
        assert starts.read_text().splitlines() == ["1", "6", "1"]


CRASHER = '''
import os, signal
from checkpoint import State
state = State()
with open(os.environ["LOADS"], "a") as f:
    f.write(f"{state.label}\\n")
os.killpg(os.getpgrp(), signal.SIGKILL)  # takes the wrapper down too: a crash outside the application
'''


@pytest.mark.anyio
async def test_a_job_that_crashes_after_every_load_is_stopped_by_the_restart_counter(tmp_path: Path) -> None:
    """Acceptance 5: resumed from the same state max_restarts_per_state times, then failed, with a
    history entry saying why."""
    loads = tmp_path / "loads"
    config = {**FAST, "checkpoint": {"max_restarts_per_state": 2}}
    async with Orchestrator(home=tmp_path / "home", config=config) as orch:
        job = await orch.jobs.add(python_job(tmp_path, "crasher.py", CRASHER, steps="1..5",
                                             env={"LOADS": str(loads)}))
        await job.submit()
        await job.wait(timeout=60)
        assert job.status == "failed" and job.info.submit_counter == 3
        assert loads.read_text().splitlines() == ["0:0"] * 3
        history = job.info.history
        assert [(h["level"], h["action"]) for h in history] == [("worker", "retry")] * 2 + [("worker", "failed")]
        assert [h.get("restart") for h in history[:2]] == [1, 2]
        stop = history[-1]
        assert stop["limit"] == "max_restarts_per_state" and stop["state"] == "0:0"
        assert "max_restarts_per_state=2 reached" in stop["reason"] and "from state 0:0" in stop["reason"]
        assert job.info.reason == stop["reason"]


@pytest.mark.anyio
async def test_a_run_whose_starting_state_cannot_be_written_is_not_started(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        job = await orch.jobs.add(Job(application=Executable("/bin/true"), steps="1..3"))
        work = job.outputdir.parent / "work"  # the run's $ORCH_HOME, where its states are written
        if work.is_dir():
            work.rmdir()
        work.parent.mkdir(parents=True, exist_ok=True)
        work.write_text("a file where the work dir goes: no state dir can be made in it\n")
        with pytest.raises(Exception, match="could not write its starting state: .*Not a directory"):
            await job.submit()
        assert job.status == "new" and await job.states() == []
