"""The shape the runtime keeps (issue "The runtime as wiring"): read from the source, so a change that grows it
back fails here.

- ``Runtime`` only wires its pieces: fewer than 12 methods (nested functions counted).
- The transport is a handful of calls: fewer than 8 methods in the ``Transport`` protocol.
- Nothing outside the core reads a job's whole state (``job_state(``): the core offers narrow reads.
"""

from __future__ import annotations

import ast
from pathlib import Path

import orchestrator

PACKAGE = Path(orchestrator.__file__).parent


def methods_of(path: Path, name: str) -> list[str]:
    tree = ast.parse(path.read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
    return [n.name for n in ast.walk(cls) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_the_runtime_only_wires_its_pieces() -> None:
    found = methods_of(PACKAGE / "runtime" / "runtime.py", "Runtime")
    assert len(found) < 12, found


def test_the_transport_is_a_handful_of_calls() -> None:
    found = methods_of(PACKAGE / "api" / "transport.py", "Transport")
    assert len(found) < 8, found


def test_only_the_core_reads_a_jobs_whole_state() -> None:
    readers = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               if "job_state(" in p.read_text() and p.relative_to(PACKAGE).parts[0] != "core"]
    assert readers == []
