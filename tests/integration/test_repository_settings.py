"""``[repository]`` settings: a bad one is refused naming the key; a database out of reach is named, never its
password; both as one line and exit code 2 from the command line, before anything is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from served import cli


@pytest.mark.parametrize(("settings", "said"), [
    ('url = "mysql://db/orch"', "repository.url must be empty (the home's SQLite file) or a PostgreSQL URL"),
    ('shared_dir = "/tmp/x"', "repository.shared_dir is for a shared (PostgreSQL) repository"),
    ('url = "postgresql://db/o"\nshared_dir = "relative/dir"', "repository.shared_dir must be an absolute path"),
    ('url = "postgresql://db/o"\nlease_seconds = 0.5', "repository.lease_seconds must be a number of seconds >= 1"),
])
def test_a_bad_setting_is_refused_naming_it(tmp_path: Path, settings: str, said: str) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text(f"[repository]\n{settings}\n")
    for args in (("jobs",), ("serve",)):
        done = cli(home, *args, timeout=30)
        assert done.returncode == 2 and said in " ".join(done.stderr.split()), done.stderr
        assert "Traceback" not in done.stderr
    assert not (home / "repository.sqlite").exists()


def test_a_database_out_of_reach_is_named_without_its_password(tmp_path: Path) -> None:
    url = f"postgresql://orch:secret-word@/orch?host={tmp_path / 'nowhere'}&port=1"
    done = cli(tmp_path / "home", "--repository", url, "jobs", timeout=30)
    message = " ".join(done.stderr.split())
    assert done.returncode == 2 and "cannot use the repository postgresql://orch:***@/orch" in message, message
    assert "secret-word" not in done.stderr + done.stdout and "Traceback" not in done.stderr


def test_the_service_and_the_command_line_load_without_asyncpg() -> None:
    """asyncpg comes with the ``postgresql`` extra only: a SQLite home's service and CLI must not need it."""
    code = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] == 'asyncpg':
            raise ModuleNotFoundError("No module named 'asyncpg'")
sys.meta_path.insert(0, Block())
import orchestrator.cli, orchestrator.service.cli, orchestrator.service.daemon
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
