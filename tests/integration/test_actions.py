"""The action table through the public API and the CLI (on ``sim``; on real Slurm see ``test_slurm.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from sshd import env_or_skip

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


# --------------------------------------------------------------------------- conditions and actions on local
#: The wrapper's shell is the application's parent: the run says which one it got, and wants bash.
WANTS_BASH = 'case "$(cat /proc/$PPID/comm)" in bash) echo "under bash" ;; *) echo "needs bash" >&2; exit 5 ;; esac'
#: Exits with ``$1`` on the first ``$2`` attempts, then 0.
EXITS = 'if [ "$ORCH_RETRY_COUNT" -lt "$2" ]; then exit "$1"; fi'
TABLE = '''
[[actions]]
name = "wants-bash"
backends = ["local"]
stderr = "needs bash"
action = "elsewhere"
set = {shell = "/bin/bash"}
max = 1

[[actions]]
name = "transient-codes"
exit_codes = [10, 19]
action = "retry"
max = 2
'''


def local(name: str, script: str, *args: str) -> Job:
    return Job(name=name, application=Executable("/bin/sh", args=["-c", script, "sh", *args]), backend="local",
               retry=NO_RETRIES)


async def test_stderr_pattern_elsewhere_and_exit_code_range_rules_on_local(tmp_path: Path) -> None:
    home = home_with(tmp_path, TABLE)
    async with Orchestrator(home=home) as orch:
        moved = await orch.jobs.add(local("moved", WANTS_BASH))
        twice = await orch.jobs.add(local("twice", EXITS, "12", "2"))
        always = await orch.jobs.add(local("always", EXITS, "15", "9"))
        outside = await orch.jobs.add(local("outside", EXITS, "3", "1"))
        await orch.jobs[:].submit()
        await orch.jobs[:].wait(timeout=60)

        # stderr's last lines matched: retried with other backend settings, which the job keeps from then on.
        assert moved.status == "completed" and await moved.peek() == "under bash\n"
        [entry] = moved.info.history
        assert (entry["rule"], entry["change"], entry["action"]) == ("wants-bash", "shell=/bin/bash", "retry")
        assert "needs bash" in entry["reason"] and moved.info.counters == {"rule:wants-bash": 1}

        # An exit code in [10, 19]: retried on the rule's own budget, within its max.
        assert twice.status == "completed" and twice.info.submit_counter == 3
        assert [(h["rule"], h["exit_code"]) for h in twice.info.history] == [("transient-codes", 12)] * 2
        assert always.status == "failed" and always.info.history[-1]["limit"] == "rule:transient-codes"
        assert always.info.counters == {"rule:transient-codes": 2}
        # Outside the range, no rule: the job's own limits (none) decide.
        assert outside.status == "failed" and "rule" not in outside.info.history[-1]
        assert outside.info.history[-1]["exit_code"] == 3
    async with Orchestrator(home=home) as orch:
        assert orch.jobs[moved.id].backend.settings["shell"] == "/bin/bash"  # stored


# --------------------------------------------------------------------------- a default rule: ssh-host-silent
async def test_a_silent_hosts_runs_are_retried_on_another_by_the_default_rule(tmp_path: Path) -> None:
    env = env_or_skip(2)
    try:
        config = {"core": {"poll_interval": 0.1}, "backends": {"ssh": {"lost_after_seconds": 1.0}}}
        script = 'sleep 1.5; echo "done $0"'
        async with Orchestrator(home=tmp_path / "home", config=config) as orch:
            j = await orch.jobs.add(Job(name="ssh", application=Executable("/bin/sh", args=["-c", script, "-"]),
                                        splitter=ArgSplitter([["-c", script, str(i)] for i in range(4)]),
                                        backend=Backend("ssh", **env.settings(slots=2)), retry=NO_RETRIES))
            await j.submit()
            with anyio.fail_after(30):
                while len(j.subjobs.select(status="running")) < 4:
                    await anyio.sleep(0.05)
            silent = [s for s in j.subjobs if (s.backend_id or "").endswith(env.hosts[0])]
            assert len(silent) == 2
            env.sshds[0].stop()  # the host goes away; the other keeps answering
            await j.wait(timeout=60)
            assert j.status == "completed", [(s.fqid, s.info.reason) for s in j.subjobs]
            for sub in silent:
                [entry] = sub.info.history
                assert (entry["rule"], entry["action"], entry["level"]) == ("ssh-host-silent", "retry", "orchestrator")
                assert "did not answer for" in entry["reason"]
                assert sub.info.counters == {"rule:ssh-host-silent": 1}  # the job's own limits are zero
                assert (sub.backend_id or "").endswith(env.hosts[1]) and await sub.peek() == f"done {sub.id}\n"
    finally:
        env.cleanup()
