"""Workflow files: a DØ workflow written in TOML.

```toml
id = "reco001"                      # optional: wf1, wf2, ... by default
originator = "reco@fnal.gov"
priority = 5
hold = false
slots = 4                           # packages of this workflow running at once (optional)
backend = "local"                   # or { name = "local", shell = "/bin/sh" }
retry = { max_early = 2 }           # the default of packages that set none

[[stage]]                           # ids default to positions: stage 1, line 1, package 1
[[stage.line]]
early_start = false
[[stage.line.package]]
priority = 0
nodes = ["localhost"]               # node restriction list
estimated_run_time = 120
[[stage.line.package.binary]]
name = "reco"
executable = "./reco.sh"            # a relative path with a '/' resolves against this file's directory
args = ["raw_1.dat"]
inputs = [{ name = "raw_1.dat", locator = "raw/raw_1.dat", acquisition = "copy", disposition = "deletable" }]
outputs = ["reco_1.root", { name = "filtered_1.root", estimated_size = 10000 }]
```

A line of a single package may give its binaries directly: ``[[stage.line.binary]]``.
Relative locators resolve against the file's directory too. The file is
checked completely (keys, types, ids, and the implied DAG once submitted);
each problem raises :class:`WorkflowFileError` naming the file and the field,
or the data file for a cycle or a missing producer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ...runtime.tomlfile import read_toml
from .model import Workflow
from .values import WorkflowError


class WorkflowFileError(WorkflowError):
    """``workflow file PATH: message [field F]``."""

    def __init__(self, path: str | os.PathLike[str], message: str, field: str | None = None,
                 file: str | None = None) -> None:
        super().__init__(f"workflow file {path}: {message}", field=field, file=file)
        self.path = Path(path)


def load_workflow(path: str | os.PathLike[str]) -> Workflow:
    """Read and check the workflow file at ``path``; the result is normalized (ids set), not yet submitted."""
    path = Path(path).expanduser()
    return workflow_from_dict(read_toml(path, WorkflowFileError), path)


def workflow_from_dict(data: dict[str, Any], path: str | os.PathLike[str]) -> Workflow:
    """Build a workflow from a parsed file; ``path`` names it in errors and anchors relative paths."""
    base = Path(path).resolve().parent
    _resolve_paths(data, base)
    try:
        return Workflow.from_dict(data).normalized()
    except WorkflowError as exc:
        raise WorkflowFileError(path, _bare(exc), exc.field, exc.file) from None
    except TypeError as exc:  # a constructor refused a value of the wrong shape
        raise WorkflowFileError(path, str(exc)) from None


def _bare(exc: WorkflowError) -> str:
    text = str(exc)
    suffix = f" [field {exc.field}]" if exc.field else ""
    return text[: -len(suffix)] if suffix and text.endswith(suffix) else text


def _tables(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _resolve_paths(data: dict[str, Any], base: Path) -> None:
    """Executables with a '/' and locators, relative to the file's directory (bad shapes are left to the checks)."""
    for stage in _tables(data.get("stage")):
        for line in _tables(stage.get("line")):
            binaries = _tables(line.get("binary"))
            for package in _tables(line.get("package")):
                binaries += _tables(package.get("binary"))
            for binary in binaries:
                exe = binary.get("executable")
                if isinstance(exe, str) and "/" in exe and not os.path.isabs(exe) and (base / exe).is_file():
                    binary["executable"] = str(base / exe)
                for f in _tables(binary.get("inputs")):
                    loc = f.get("locator")
                    if isinstance(loc, str) and loc and not os.path.isabs(os.path.expanduser(loc)):
                        f["locator"] = str(base / loc)
