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


def _code_dir() -> Path:
    """The checkout whose ``orchestrator`` this interpreter imports (a before/after run uses two)."""
    try:
        import orchestrator
        return Path(orchestrator.__file__).resolve().parent
    except ImportError:
        return HERE


def _git_rev() -> str | None:
    """The revision of the code measured, not of this script (``+dirty``: uncommitted changes)."""
    where = _code_dir()
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True,
                             timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
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


def status_counts(orch: Any, job: Any) -> dict[str, int]:
    """A master's subjobs per status, through the public API: ``len(job.subjobs.select(status=s))``.

    The code before the event-driven core built every matching subjob object for that, so there the
    engine's own counters are read instead (its fastest way; a before/after comparison stays fair).
    """
    engine = getattr(orch, "engine", None)
    if engine is not None and hasattr(engine, "sm"):
        return {s.value: c for s, c in engine.sm.master(job.id).count_map().items()}
    from orchestrator import JobStatus
    counts = {s.value: len(job.subjobs.select(status=s)) for s in JobStatus}
    return {s: c for s, c in counts.items() if c}


async def status_changes(orch: Any) -> Any:
    """Yield ``(time, fqids, new statuses)`` for every status change: ``orch.events()``, or the old bus."""
    from orchestrator import JobStatus
    if hasattr(orch, "events"):
        async for ev in orch.events():
            if type(ev).__name__ == "StatusChanged":
                ids = ev.ids
                yield ev.time, ids, [ev.new] * len(ids)
        return
    async for ev in orch.engine.bus.subscribe(max_buffer=1_000_000):
        yield ev.time, ev.ids, [JobStatus(s) for s in ev.new]


def persisted_completed(db_path: Path, master: int) -> int:
    """How many of ``master``'s subjobs the repository file says are completed (read with plain sqlite3).

    Since schema v3 a master's statuses are one blob of status codes in ``runs``; before, one row each.
    """
    import sqlite3
    with sqlite3.connect(db_path) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "runs" in tables:
            from orchestrator import JobStatus
            row = db.execute("SELECT status FROM runs WHERE job=?", (master,)).fetchone()
            return bytes(row[0]).count(JobStatus.COMPLETED.code) if row else 0
        (done,) = db.execute("SELECT COUNT(*) FROM subjobs WHERE master=? AND status='completed'",
                             (master,)).fetchone()
        return int(done)


_TICK = os.sysconf("SC_CLK_TCK")


def proc_times(pid: int) -> tuple[float, float, float, float] | None:
    """CPU seconds of a process read in ``/proc``: its user and system time (all its threads), and its reaped
    children's user and system time; ``None`` when it is gone. A zombie keeps them until reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    utime, stime, cutime, cstime = (int(x) / _TICK for x in fields[11:15])
    return utime, stime, cutime, cstime


def peak_of(pid: int) -> float:
    """A live process's peak RSS in MiB (``VmHWM``).

    Not ``ru_maxrss``: a process started by a fork or vfork keeps in it the peak of the process it was forked
    from (Linux records the old memory's peak at ``exec``), so every side would count this script's parent.
    """
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")), 0.0)
    except OSError:
        return 0.0
