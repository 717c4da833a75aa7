"""A ``local`` run as the driver holds it, and the starting of a batch of runs in a worker thread."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.plugin import RunSpec
from orchestrator.plugin.processes import spawn_detached
from orchestrator.plugin.wrapper import SpawnError, base_environ, make_run_dirs, wrapper_argv, wrapper_env

from .journal import Record


@dataclass(slots=True, eq=False)
class Run:
    """A run this driver answers for, from its acceptance (or its adoption after a restart) to its end."""

    key: str
    fqid: str
    shell: str
    jobdir: Path
    record: Record
    #: What starting it needs; ``None`` once started.
    spec: RunSpec | None = None
    #: A run accepted by an earlier version of this driver, not yet started: its run file.
    runfile: Path | None = None
    pid: int | None = None
    launching: bool = False
    #: Counted against ``max_running``.
    occupies: bool = False
    #: Killed or forgotten: its end is not reported, and it is not started if it has not been.
    silent: bool = False
    #: Killed: if it was being started all the same, it is stopped at once.
    killed: bool = False
    ended: bool = False
    #: An INTENT without a process (a crash around the spawn): decided at this time.
    recheck_at: float | None = None


@dataclass(slots=True)
class Start:
    """What one start needs, handed to a worker thread (which touches nothing else of the driver)."""

    run: Run
    argv: list[str]
    env: dict[str, str]
    spec: RunSpec | None
    pid: int | None = None
    problem: str | None = None


def start_all(starts: Sequence[Start], out: int) -> None:
    """Make each run's directories and start its wrapper (in a worker thread: ``mkdir`` and ``spawn_detached`` let
    go of the interpreter lock, so the event loop, and the other workers, go on meanwhile)."""
    for start in starts:
        if start.run.silent:  # killed meanwhile: not started
            continue
        try:
            if start.spec is not None:
                make_run_dirs(start.spec)
        except OSError as exc:
            start.problem = f"could not make the run's directories: {exc}"
            continue
        try:
            start.pid = spawn_detached(start.argv, start.env, out=out)
        except SpawnError as exc:
            start.problem = str(exc)


def starts_of(batch: Sequence[Run], wrapper: Path, *, notify: str, boot: int) -> list[Start]:
    """Each run's command line and environment: ``sh wrapper.sh --env KEY COMMAND...`` (or, for a run accepted
    by an earlier version of the driver, ``sh wrapper.sh RUNFILE``)."""
    base, bindir = base_environ(), str(wrapper.parent)
    out = []
    for run in batch:
        if run.spec is not None:
            out.append(Start(run, wrapper_argv(run.shell, wrapper, run.spec),
                             wrapper_env(run.spec, base, bindir=bindir, notify=notify, boot=boot), run.spec))
        else:
            out.append(Start(run, [run.shell, str(wrapper), str(run.runfile)], dict(os.environ), None))
    return out
