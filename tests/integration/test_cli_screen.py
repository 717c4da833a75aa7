"""``orchestrator wait`` as a person sees it: run in a real terminal (tmux), its screen read back."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator

pytestmark = [pytest.mark.anyio,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed "
                                 "(scripts/install-test-deps.sh installs it)")]

EXE = str(Path(sys.executable).with_name("orchestrator"))


def screen(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True,
                          check=True).stdout


async def test_wait_draws_a_live_bar_with_counts_then_the_ending(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with Orchestrator(home=home) as orch:
        j = await orch.jobs.add(Job(name="screen", application=Executable("/bin/true"),
                                    splitter=ArgSplitter([[str(i)] for i in range(30)]),
                                    backend=Backend("sim", run_seconds=1.0, outcome={7: "failed"},
                                                    queued={i: 0.25 * i for i in range(30)})))
        await j.submit()
    session = f"orch-{uuid.uuid4().hex[:8]}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "20",
                    f"{EXE} --home {home} wait {j.fqid}; echo EXIT=$?; sleep 60"], check=True)
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            text = screen(session)
            seen.append(text)
            if "EXIT=" in text:
                break
            time.sleep(0.2)
        final = seen[-1]
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    # While it ran: the bar, "done/total" and the counts per status, redrawn in place.
    live = [s for s in seen if re.search(rf"job {j.fqid} (submitted|running)", s)]
    assert live, seen[:3]
    assert any(re.search(r"━+.*\b\d+/30\b.*(running|completed) \d+", s) for s in live), live[-1]
    progress = [int(m.group(1)) for s in live for m in [re.search(r"\b(\d+)/30\b", s)] if m]
    assert progress == sorted(progress) and progress[0] < 30
    # At the end: one line with the ending, the counts, and the exit code 1 (a subjob failed).
    assert f"job {j.fqid} failed: 30/30 final (completed 29  failed 1)" in final
    assert "EXIT=1" in final
    assert final.count(f"job {j.fqid}") <= 2  # the bar was redrawn, not printed line after line


async def test_ctrl_c_during_wait_says_the_job_goes_on(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with Orchestrator(home=home) as orch:
        j = await orch.jobs.add(Job(name="long", application=Executable("/bin/true"),
                                    splitter=ArgSplitter([["0"], ["1"]]), backend=Backend("sim", run_seconds=600)))
        await j.submit()
    session = f"orch-{uuid.uuid4().hex[:8]}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "20",
                    f"{EXE} --home {home} wait {j.fqid}; echo EXIT=$?; sleep 60"], check=True)
    try:
        deadline = time.monotonic() + 30
        while f"job {j.fqid}" not in screen(session) and time.monotonic() < deadline:
            time.sleep(0.2)
        subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)
        while "EXIT=" not in (text := screen(session)) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    flat = " ".join(text.split())
    assert f"stopped watching; job {j.fqid} goes on (watch it again with 'orchestrator wait {j.fqid}')" in flat
    assert "Traceback" not in text
    async with Orchestrator(home=home) as orch:  # it goes on indeed
        assert orch.jobs[j.id].status in ("submitted", "running")
        await orch.jobs[j.id].kill()
