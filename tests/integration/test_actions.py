"""The action table through the public API and the CLI (on ``sim``; on real Slurm see ``test_slurm.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import ArgSplitter, Backend, ConfigError, Executable, Job, Orchestrator, RetryPolicy

pytestmark = pytest.mark.anyio

EXE = str(Path(sys.executable).with_name("orchestrator"))
NO_RETRIES = RetryPolicy(max_early=0, max_late_handled=0, max_late_unhandled=0)


def home_with(tmp_path: Path, table: str) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text(table)
    return home


def flaky(outcomes: dict[int, list[str]]) -> Job:
    return Job(name="flaky", application=Executable("/bin/true"), retry=NO_RETRIES,
               splitter=ArgSplitter([[str(i)] for i in range(3)]),
               backend=Backend("sim", run_seconds=0.02, outcome=outcomes))


async def test_a_rule_retries_on_its_own_budget_not_the_jobs(tmp_path: Path) -> None:
    home = home_with(tmp_path, '[[actions]]\nname = "sim-flake"\nbackends = ["sim"]\nreason = "outcome failed"\n'
                               'action = "retry"\nmax = 2\n')
    async with Orchestrator(home=home) as orch:
        j = await orch.jobs.add(flaky({0: ["failed", "failed", "completed"], 1: ["failed"] * 4}))
        await j.submit()
        await j.wait(timeout=30)
        first, second = j.subjobs[0], j.subjobs[1]
        assert first.status == "completed" and first.info.submit_counter == 3
        assert first.info.counters == {"rule:sim-flake": 2}  # the job allows no retry at all: the rule's own
        assert [(h["rule"], h["action"], h["change"]) for h in first.info.history] == [("sim-flake", "retry",
                                                                                        "retry")] * 2
        # Past its max the rule fails the run, naming itself; the job's own limits were never touched.
        assert second.status == "failed" and second.info.submit_counter == 3
        assert second.info.history[-1]["limit"] == "rule:sim-flake" and second.info.history[-1]["action"] == "failed"
        assert "rule sim-flake retried it 2 time(s): its max=2 reached" in (second.info.reason or "")
        assert j.subjobs[2].status == "completed" and not j.subjobs[2].info.history


async def test_hold_and_fail_rules(tmp_path: Path) -> None:
    home = home_with(tmp_path, '[[actions]]\nname = "park"\nreason = "outcome failed"\naction = "hold"\n\n'
                               '[[actions]]\nname = "give-up"\nlevel = "application"\naction = "fail"\n')
    async with Orchestrator(home=home) as orch:
        j = await orch.jobs.add(flaky({0: ["failed", "completed"]}))
        await j.submit()
        await j.wait(timeout=30)
        held = j.subjobs[0]
        assert held.status == "held" and held.info.history[-1]["rule"] == "park"
        assert "held by rule park" in (held.info.reason or "")
        await held.release()
        await j.wait(timeout=30)
        assert held.status == "completed"


async def test_a_malformed_table_is_refused_at_start_naming_the_rule_and_field(tmp_path: Path) -> None:
    home = home_with(tmp_path, '[[actions]]\naction = "retry"\n\n[[actions]]\naction = "more_memory"\n'
                               'factor = 0.5\n')
    with pytest.raises(ConfigError, match=r"actions\[2\]\.factor: a number greater than 1"):
        async with Orchestrator(home=home):
            pass
    for argv in (["jobs"], ["serve"]):
        done = subprocess.run([EXE, "--home", str(home), *argv], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "COLUMNS": "200"})
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert "actions[2].factor: a number greater than 1" in done.stderr and "Traceback" not in done.stderr
        assert str(home / "orchestrator.toml") in done.stderr
