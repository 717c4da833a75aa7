"""Useful and wasted CPU (GBS): a checkpointed job stopped twice mid-run and resumed, reported per cause."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from orchestrator import Executable, Job, Orchestrator
from orchestrator import checkpoint as checkpoint_module

pytestmark = pytest.mark.anyio

EXE = str(Path(sys.executable).with_name("orchestrator"))

#: Burns CPU: 0.4 s of set-up before any state is saved, then 0.05 s per step, saving after each.
BURNER = '''
import os, time
from checkpoint import State

def burn(seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass

state = State()
with open(os.environ["MARKS"], "a") as f:
    f.write(f"{os.environ['ORCH_ATTEMPT']} {state.label}\\n")
burn(0.4)
while (step := state.get_next_step()) is not None:
    burn(0.05)
    state.save_value("last", step)
    state.save_state()
state.set_final_state()
state.save_state()
'''


def stop(outputdir: Path, attempt: int) -> None:
    """SIGTERM to the attempt's process group (as a kill or a batch system's preemption would)."""
    pid = int((outputdir / f"orch.{attempt}.log").read_text().split()[2])
    os.killpg(pid, signal.SIGTERM)


async def test_cpu_of_resumed_attempts_is_useful_and_the_rest_wasted(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    script = tmp_path / "burner.py"
    script.write_text(BURNER)
    home = tmp_path / "home"
    async with Orchestrator(home=home, config={"core": {"poll_interval": 0.05}}) as orch:
        job = await orch.jobs.add(Job(name="burner", application=Executable(sys.executable, ["burner.py"],
                                                                             env={"MARKS": str(marks)}),
                                      inputfiles=[str(script), checkpoint_module.__file__], steps="1..40",
                                      backend="local"))
        await job.submit()
        with anyio.fail_after(30):  # attempt 1 is in its set-up: nothing saved yet
            while not marks.exists():
                await anyio.sleep(0.02)
        await anyio.sleep(0.15)
        stop(job.outputdir, 1)
        with anyio.fail_after(30):  # attempt 2 (the automatic resumption) saves states
            while job.info.submit_counter < 2 or job.info.checkpoint.get("seq", 0) < 10:
                await anyio.sleep(0.02)
        stop(job.outputdir, 2)
        await job.wait(timeout=60)
        assert job.status == "completed", job.info.history
        assert [line.split()[0] for line in marks.read_text().splitlines()] == ["1", "2", "3"]
        assert [h["level"] for h in job.info.history] == ["worker", "worker"]

    done = subprocess.run([EXE, "--home", str(home), "report", "0", "--json"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # The attempts' own records: attempt 1 stopped before it saved anything (nobody resumed from it: wasted),
    # attempt 2 saved states that attempt 3 resumed from (useful), attempt 3 completed (useful).
    records = (job.outputdir / "orch.usage").read_text().splitlines()
    heads = [line.split() for line in records[0::3]]
    assert [(h[0], h[5]) for h in heads] == [("1", "143"), ("2", "143"), ("3", "0")]
    assert heads[0][1] == heads[0][2] == heads[1][1] and int(heads[2][1]) >= 10
    assert report["attempts"] == 3
    assert report["cpu"] == pytest.approx(report["useful"] + report["wasted"])
    assert 0.05 < report["wasted"] < 0.45 and report["useful"] > 2.0
    assert report["wasted_by_cause"] == {"worker: early": pytest.approx(report["wasted"])}

    text = subprocess.run([EXE, "--home", str(home), "report", "0"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "120"}).stdout
    assert "useful" in text and "wasted" in text and "worker: early" in text
