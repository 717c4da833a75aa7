"""The job wrapper's Python side: install it, write a run's file, read its log.

Every backend runs ``sh wrapper.sh RUNFILE`` on the worker. The run file is
a shell fragment in which every value is quoted with :func:`shlex.quote`:
no shell string is ever built from user data without quoting.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from .drivers import RunSpec

SCRIPTS = ("wrapper.sh", "orch-log", "orch-state")
RUNFILE = "run.env"


def boot_time() -> int:
    """This machine's boot time (epoch seconds), for the wrapper's fast clock."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def install_scripts(bindir: Path) -> Path:
    """Copy the wrapper and its helpers into ``bindir``; return the wrapper's path."""
    bindir.mkdir(parents=True, exist_ok=True)
    package = resources.files("orchestrator") / "scripts"
    for name in SCRIPTS:
        target = bindir / name
        data = (package / name).read_bytes()
        if not target.exists() or target.read_bytes() != data:
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.chmod(0o755)
            tmp.replace(target)
    return bindir / "wrapper.sh"


def script_text(name: str) -> str:
    return (resources.files("orchestrator") / "scripts" / name).read_text()


def render_runfile(run: RunSpec, *, bindir: str, notify: str | None = None, boot: int | None = None,
                   paths: dict[str, str] | None = None) -> str:
    """The run file's text. ``paths`` overrides directories (a remote worker's)."""
    p = paths or {}
    q = shlex.quote
    values = {
        "ORCH_FQID": run.fqid,
        "ORCH_KEY": run.key,
        "ORCH_OUTDIR": p.get("outputdir", str(run.outputdir)),
        "ORCH_HOME": p.get("workdir", str(run.workdir)),
        "ORCH_BIN": bindir,
        "ORCH_MODE": run.mode,
        "ORCH_RETRY_COUNT": str(run.retry_count),
        "ORCH_OUTPUTFILES": "\n".join(run.outputfiles),
        "ORCH_NOTIFY": notify or "",
        "ORCH_BOOT": str(boot) if boot else "",
    }
    lines = [f"{k}={q(v)}" for k, v in values.items()]
    for i, arg in enumerate(run.retry_args, 1):
        lines.append(f"ORCH_RETRY_ARG_{i}={q(arg)}; export ORCH_RETRY_ARG_{i}")
    for k, v in run.env.items():
        lines.append(f"{k}={q(v)}; export {k}")
    lines.append("set -- " + " ".join(q(a) for a in (run.executable, *run.args)))
    return "\n".join(lines) + "\n"


def prepare_local(run: RunSpec, *, bindir: Path, notify: Path | None = None) -> Path:
    """Make a run's directories on this machine, link its inputs, write its run file."""
    for d in (run.outputdir, run.workdir):
        d.mkdir(parents=True, exist_ok=True)
    for src in run.inputs:
        link = run.workdir / src.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(src)
    runfile = run.jobdir / RUNFILE
    runfile.write_text(render_runfile(run, bindir=str(bindir), notify=str(notify) if notify else None,
                                      boot=boot_time()))
    return runfile


def clear_outputs(outputdir: Path) -> None:
    """Empty an output dir before a new run writes into it."""
    if outputdir.is_dir():
        for entry in outputdir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


@dataclass
class RunLog:
    """What the wrapper's log says about one run."""

    started: float | None = None
    exit_code: int | None = None
    ended: float | None = None
    end_code: int | None = None
    keywords: list[tuple[float, str, str]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.end_code is not None


def parse_log(text: str) -> RunLog:
    """Read ``orch.log``; malformed lines are kept as INFO, never a crash."""
    log = RunLog()
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) < 2:
            continue
        try:
            ts = float(parts[0])
        except ValueError:
            continue
        word, data = parts[1], parts[2] if len(parts) > 2 else ""
        if word == "START":
            log.started = ts
        elif word == "EXIT":
            log.exit_code = _int(data)
        elif word == "END":
            log.ended, log.end_code = ts, _int(data)
        else:
            log.keywords.append((ts, word, data))
    return log


def read_log(outputdir: Path) -> RunLog:
    try:
        return parse_log((outputdir / "orch.log").read_text(errors="replace"))
    except FileNotFoundError:
        return RunLog()


def _int(text: str) -> int | None:
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
