"""The State API on its own: Python and shell read and write one format; steps; partitioning; the states table."""

from __future__ import annotations

import itertools
import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import orchestrator.checkpoint as checkpoint_module
from orchestrator import Executable, Job, StepSplitter
from orchestrator.checkpoint import State, StateError, StateTooLarge, Steps, initial_text
from orchestrator.core.splitters import partition_contiguous
from orchestrator.runtime.repository import Save, StateRow
from orchestrator.runtime.sqlite_repository import SqliteRepository

HELPER = Path(checkpoint_module.__file__).parent / "scripts" / "orch-state"
WEIRD = "tab\there, back\\slash\\n, new\nline, cr\r, unicode é✓, 'quotes' \"and\" $dollars `ticks`"


def helper(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {"PATH": os.environ["PATH"], "ORCH_HOME": str(home), "ORCH_FQID": "7.3", **(env or {})}
    out = subprocess.run(["sh", str(HELPER), *args], env=full, capture_output=True, timeout=30)
    return subprocess.CompletedProcess(out.args, out.returncode, out.stdout.decode(), out.stderr.decode())


def test_steps_ranges_and_lists() -> None:
    r = Steps("1..1000000")
    assert len(r) == 1_000_000 and r[0] == "1" and r[-1] == "1000000" and r[10:20].spec() == "11..20"
    labels = Steps(["a", 2, "c d"])
    assert list(labels) == ["a", "2", "c d"] and labels[1:].spec() == ["2", "c d"]
    for bad in ("5..1", "x..3", "12"):
        with pytest.raises(ValueError):
            Steps(bad)
    with pytest.raises(ValueError, match="tab"):
        Steps(["ok", "bad\tlabel"])


def test_python_save_load_resume(tmp_path: Path) -> None:
    home = tmp_path / "work"
    checkpoint_module.write_state_dir(home / ".orch-state", initial_text("7.3", "10..14"), 0)
    s = State(home, fqid="7.3", keep=3)
    assert s.label == "7.3:0" and s.get_int_value("n") is None and s.get_next_step() == "10"
    s.save_value("n", 1)
    s.save_value("x", 2.5)
    s.save_value("w", WEIRD)
    assert s.save_state() == "7.3:1"
    assert s.get_next_step() == "11" and s.save_state() == "7.3:2"
    again = State(home, fqid="7.3", keep=3)
    assert (again.label, again.current_step, again.get_next_step()) == ("7.3:2", "11", "12")
    assert again.get_int_value("n") == 1 and again.get_double_value("x") == 2.5 and again.get_string_value("w") == WEIRD
    for _ in range(4):
        again.save_state()
    assert sorted(p.name for p in (home / ".orch-state").glob("*.state")) == ["4.state", "5.state", "6.state"]
    assert again.load_state("7.3:5").position == 3 and not again.is_final_state("7.3:5")
    with pytest.raises(StateError, match="no state"):
        again.load_state("7.3:1")
    with pytest.raises(StateError, match="not an integer"):
        again.get_int_value("w")


def test_a_state_over_the_maximum_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    s = State(tmp_path, fqid="1", max_size=300)
    assert s.get_max_state_size() == 300.0 and s.get_state_size() < 300
    s.save_value("big", "x" * 400)
    assert s.get_state_size() > 300
    with pytest.raises(StateTooLarge, match="more than the maximum of 300"):
        s.save_state()
    assert not (tmp_path / ".orch-state" / "current").exists()
    helper(tmp_path, "save-value", "big", "y" * 400)
    out = helper(tmp_path, "save", env={"ORCH_STATE_MAX": "300"})
    assert out.returncode == 3 and "more than the maximum of 300" in out.stderr and "not saved" in out.stderr
    assert not (tmp_path / ".orch-state" / "current").exists()


def test_shell_writes_python_reads_and_back(tmp_path: Path) -> None:
    """Acceptance 3, without the orchestrator: one format, both ways, awkward values included."""
    checkpoint_module.write_state_dir(tmp_path / ".orch-state", initial_text("7.3", ["alpha", "beta two", "g\\h"]), 0)
    assert helper(tmp_path, "next-step").stdout == "alpha\n"
    assert helper(tmp_path, "save-value", "weird", WEIRD).returncode == 0
    assert helper(tmp_path, "save-value", "count", "41").returncode == 0
    assert helper(tmp_path, "save").stdout == "7.3:1\n"
    py = State(tmp_path, fqid="7.3")
    assert py.get_string_value("weird") == WEIRD and py.get_int_value("count") == 41 and py.current_step == "alpha"
    assert py.get_next_step() == "beta two"
    py.save_value("count", 42)
    py.save_value("from python", "multi\nline\tvalue\\")
    py.set_final_state()
    assert py.save_state() == "7.3:2"
    assert helper(tmp_path, "get", "count").stdout == "42\n"
    assert helper(tmp_path, "get", "from python").stdout == "multi\nline\tvalue\\\n"
    assert helper(tmp_path, "get", "weird").stdout == WEIRD + "\n"
    assert helper(tmp_path, "step").stdout == "beta two\n"
    assert helper(tmp_path, "is-final").returncode == 0 and helper(tmp_path, "is-final", "7.3:1").returncode == 1
    assert helper(tmp_path, "get", "count", "7.3:1").stdout == "41\n"
    assert helper(tmp_path, "next-step").stdout == "g\\h\n"
    done = helper(tmp_path, "next-step")
    assert done.returncode == 1 and done.stdout == ""
    assert helper(tmp_path, "get", "nope").returncode == 1
    assert helper(tmp_path, "bogus").returncode == 2


def test_unsaved_shell_changes_do_not_survive_a_new_run(tmp_path: Path) -> None:
    checkpoint_module.write_state_dir(tmp_path / ".orch-state", initial_text("7.3", "1..3"), 0)
    helper(tmp_path, "next-step")
    helper(tmp_path, "save")
    assert helper(tmp_path, "next-step").stdout == "2\n"  # not saved: the run is killed here
    (tmp_path / ".orch-state" / "work").unlink()  # what the wrapper does before the next run
    assert helper(tmp_path, "next-step").stdout == "2\n"


def test_partition_is_optimal_against_brute_force() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n, m = rng.randint(1, 9), rng.randint(1, 5)
        weights = [rng.choice([0, 1, 2, 3, 5, 8, 13, 0.5, 2.25]) for _ in range(n)]
        starts = partition_contiguous(weights, m)
        assert len(starts) == min(m, n) and starts[0] == 0 and starts == sorted(set(starts))
        bounds = [*starts, n]
        got = max(sum(weights[a:b]) for a, b in itertools.pairwise(bounds))
        best = min(max(sum(weights[a:b]) for a, b in itertools.pairwise((0, *cuts, n)))
                   for cuts in itertools.combinations(range(1, n), min(m, n) - 1))
        assert got == best, (weights, m)


def test_step_splitter_without_weights_is_even_and_checks_its_input() -> None:
    job = Job(application=Executable("/bin/true"), steps="1..10")
    assert [s["steps"] for s in StepSplitter(4).split(job)] == ["1..3", "4..6", "7..8", "9..10"]
    assert [s["steps"] for s in StepSplitter(3).split(Job(application=Executable("x"), steps=["a", "b"]))] == [
        ["a"], ["b"]]
    with pytest.raises(Exception, match="needs steps"):
        StepSplitter(2).split(Job(application=Executable("x")))
    with pytest.raises(Exception, match="m must be an integer"):
        StepSplitter(0).split(job)


@pytest.mark.anyio
async def test_a_version_1_repository_migrates_forward_and_keeps_the_newest_states(tmp_path: Path) -> None:
    path = tmp_path / "repository.sqlite"
    db = sqlite3.connect(path)
    db.executescript("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                     "INSERT INTO meta VALUES ('schema_version', '1');"
                     "CREATE TABLE jobs (id INTEGER PRIMARY KEY, name TEXT NOT NULL, status TEXT NOT NULL, "
                     "spec TEXT NOT NULL, backend_id TEXT, info TEXT NOT NULL, n_subjobs INTEGER NOT NULL DEFAULT 0, "
                     "master TEXT);"
                     "CREATE TABLE subjobs (master INTEGER NOT NULL, idx INTEGER NOT NULL, name TEXT NOT NULL, "
                     "status TEXT NOT NULL, spec TEXT NOT NULL, backend_id TEXT, info TEXT NOT NULL, "
                     "PRIMARY KEY (master, idx)) WITHOUT ROWID;")
    db.close()
    repo = SqliteRepository(path)
    await repo.open()
    try:
        assert await repo.schema_version() == 3
        for seq in range(6):
            rows = [StateRow("3.1", seq, float(seq), seq == 5, f"s{seq}"), StateRow("3", seq, 0, False, "")]
            await repo.save(Save(states=rows, keep=3))
        assert [r.seq for r in await repo.states("3.1")] == [3, 4, 5]
        newest = await repo.state("3.1")
        assert newest is not None and newest.final and newest.label == "3.1:5" and newest.data == "s5"
        await repo.remove_job(3)
        assert await repo.states("3.1") == [] and await repo.states("3") == []
    finally:
        await repo.close()


def test_the_state_module_runs_alone_with_the_standard_library(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.py").write_text(Path(checkpoint_module.__file__).read_text())
    code = ("import sys; from checkpoint import State; s = State(); s.save_value('k', 'v'); print(s.save_state()); "
            "print(sorted(m for m in sys.modules if m.startswith('orchestrator')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                         env={"ORCH_HOME": str(tmp_path), "ORCH_FQID": "5", "PATH": os.environ["PATH"]})
    assert out.stdout == "5:1\n[]\n", out.stderr
