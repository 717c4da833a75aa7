"""Shared helpers of the benchmark scripts: machine facts and the results file."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results.jsonl"


def peak_rss_mib() -> float:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1024 if sys.platform != "darwin" else kib / (1024 * 1024)


def _git_rev() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                             timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                               capture_output=True, text=True, timeout=5)
        rev = out.stdout.strip()
        return f"{rev}{'+dirty' if dirty.stdout.strip() else ''}" if rev else None
    except (OSError, subprocess.SubprocessError):
        return None


def record(bench: str, line: str, **fields: Any) -> dict[str, Any]:
    """Print the result line and append one JSON line to ``results.jsonl``."""
    entry = {
        "bench": bench,
        "when": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "git": _git_rev(),
        **fields,
    }
    print(line, flush=True)
    with open(RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry, sort_keys=False) + "\n")
    return entry
