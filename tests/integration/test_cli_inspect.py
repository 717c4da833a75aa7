"""The command line as a Ganga or Slurm user reaches for it: jobs, show --status, peek, --json, --version.

Run as a user runs it: the ``orchestrator`` executable in a subprocess, on a
home where the jobs were made through the public API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator

pytestmark = pytest.mark.anyio

EXE = str(Path(sys.executable).with_name("orchestrator"))


def cli(home: Path, *args: str, code: int = 0) -> str:
    done = subprocess.run([EXE, "--home", str(home), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done.stdout


@pytest.fixture
async def production(tmp_path: Path) -> Path:
    """A home with a production of 200 sim subjobs (150 and 170 fail) and a 3-subjob local echo job."""
    home = tmp_path / "home"
    async with Orchestrator(home=home) as orch:
        prod = await orch.jobs.add(Job(name="production", application=Executable("/bin/true"),
                                       splitter=ArgSplitter([[str(i)] for i in range(200)]),
                                       backend=Backend("sim", run_seconds=0, outcome={150: "failed", 170: "failed"})))
        await prod.submit()
        echo = await orch.jobs.add(Job(name="echo", application=Executable("/bin/sh"),
                                       splitter=ArgSplitter([["-c", "seq 1 5"] for _ in range(3)]),
                                       backend="local"))
        await echo.submit()
        await prod.wait(timeout=60)
        await echo.wait(timeout=60)
        assert prod.status == "failed" and echo.status == "completed"
    return home


async def test_show_status_lists_exactly_the_failed_subjobs(production: Path) -> None:
    out = cli(production, "show", "0", "--status", "failed")
    listed = [line.split()[0] for line in out.splitlines() if line.strip().startswith("0.")]
    assert listed == ["0.150", "0.170"]
    # Every completed one is listed on request, not the first 50.
    out = cli(production, "show", "0", "--status", "completed")
    assert sum(1 for line in out.splitlines() if line.strip().startswith("0.")) == 198
    out = cli(production, "show", "0", "--all", "--offset", "100", "--limit", "5")
    assert [line.split()[0] for line in out.splitlines() if line.strip().startswith("0.")] == [
        "0.100", "0.101", "0.102", "0.103", "0.104"]


async def test_json_round_trips_the_counts(production: Path) -> None:
    shown = json.loads(cli(production, "show", "0", "--status", "failed", "--json"))
    assert shown["schema"] == 1 and shown["counts"] == {"completed": 198, "failed": 2}
    assert [r["fqid"] for r in shown["subjob_rows"]] == ["0.150", "0.170"]
    assert all(r["status"] == "failed" for r in shown["subjob_rows"])
    listing = json.loads(cli(production, "jobs", "--json"))
    by_id = {j["fqid"]: j for j in listing["jobs"]}
    assert by_id["0"]["counts"] == shown["counts"] and by_id["0"]["subjobs"] == 200
    assert by_id["1"]["counts"] == {"completed": 3} and by_id["1"]["backend"] == "local"
    assert listing["totals"] == {"jobs": 2, "subjobs": 203, "counts": {"completed": 201, "failed": 2}}
    assert by_id["0"]["submitted_at"] is not None and by_id["0"]["elapsed"] >= 0


async def test_jobs_filters_columns_and_totals(production: Path) -> None:
    out = cli(production, "jobs")
    header = out.splitlines()[0].split()
    assert header == ["id", "name", "owner", "status", "backend", "subjobs", "pending", "running", "completed",
                      "failed", "killed", "held", "submit", "elapsed"]
    assert "2 jobs" in out.splitlines()[-1] and "203" in out.splitlines()[-1]
    only = json.loads(cli(production, "jobs", "--backend", "local", "--json"))
    assert [j["name"] for j in only["jobs"]] == ["echo"]
    last = json.loads(cli(production, "jobs", "--limit", "1", "--json"))
    assert [j["fqid"] for j in last["jobs"]] == ["1"]
    failed = json.loads(cli(production, "jobs", "--status", "failed", "--json"))
    assert [j["fqid"] for j in failed["jobs"]] == ["0"]


async def test_peek_a_runs_output(production: Path) -> None:
    assert cli(production, "peek", "1.2") == "1\n2\n3\n4\n5\n"
    assert cli(production, "peek", "1.0", "stdout", "--tail", "2") == "4\n5\n"
    doc = json.loads(cli(production, "peek", "1.1", "--json"))
    assert doc == {"schema": 1, "fqid": "1.1", "name": "stdout", "text": "1\n2\n3\n4\n5\n"}
    assert cli(production, "peek", "1.1", "stderr") == ""


def test_version() -> None:
    done = subprocess.run([EXE, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("orchestrator, version ")
