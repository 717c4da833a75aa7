"""A ``local`` run as the driver holds it, and the starting of a batch of runs (in a thread, or on the loop)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from orchestrator.plugin import JobStatus, RunSpec, StatusUpdate
from orchestrator.plugin.processes import spawn_detached
from orchestrator.plugin.users import Identity, OwnerError, identity, switch_argv
from orchestrator.plugin.wrapper import SpawnError, base_environ, make_run_dirs, wrapper_argv, wrapper_env

from .journal import Journal, Record


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


def ending_of(run: Run) -> StatusUpdate:
    """What the run's record says of its end (its wrapper's END line, or why it was lost)."""
    rec = run.record
    if rec.reason is not None:
        return StatusUpdate(run.fqid, JobStatus.FAILED, reason=rec.reason)
    if rec.end_code == 0:
        return StatusUpdate(run.fqid, JobStatus.COMPLETED, exit_code=0)
    return StatusUpdate(run.fqid, JobStatus.FAILED, exit_code=rec.end_code, reason=f"exit code {rec.end_code}")


@dataclass(slots=True)
class Start:
    """What one start needs, handed to a worker thread (which touches nothing else of the driver)."""

    run: Run
    argv: list[str]
    env: dict[str, str]
    spec: RunSpec | None
    pid: int | None = None
    problem: str | None = None
    #: The owner to run as (``None``: the orchestrator's own user).
    owner: Identity | None = None
    #: Where the wrapper's own stdout and stderr go (``None``: the driver's ``wrapper.out``).
    out: int | None = None


#: Most runs started on the event loop itself, without the hop to a worker thread.
INLINE_STARTS = 2


def owner_tag(run: Run) -> str:
    """The INTENT line's value: the run's owner (whose events file may tell of it), ``-`` for none."""
    owner = run.spec.owner if run.spec is not None else run.record.owner
    return owner if owner and " " not in owner else "-"


async def start_batch(starts: Sequence[Start], out: int) -> None:
    """:func:`start_all`, in a worker thread; a run or two of the orchestrator's own user (a slot or two just
    freed) on the event loop itself, where the start costs less than the hop to a thread would."""
    if len(starts) > INLINE_STARTS or any(start.owner is not None for start in starts):
        await anyio.to_thread.run_sync(start_all, starts, out)
    else:
        start_all(starts, out)


def start_all(starts: Sequence[Start], out: int) -> None:
    """Make each run's directories and start its wrapper (in a worker thread: ``mkdir`` and ``spawn_detached`` let
    go of the interpreter lock, so the event loop, and the other workers, go on meanwhile)."""
    for start in starts:
        if start.run.silent or start.problem is not None:  # killed meanwhile, or not to be started: not started
            continue
        try:
            if start.spec is not None:
                make_run_dirs(start.spec, owner=start.owner)
        except OSError as exc:
            start.problem = f"could not make the run's directories: {exc}"
            continue
        try:
            start.pid = spawn_detached(start.argv, start.env, out=out if start.out is None else start.out)
        except SpawnError as exc:
            start.problem = str(exc)


def starts_of(batch: Sequence[Run], wrapper: Path, *, journal: Journal, boot: int) -> list[Start]:
    """Each run's command line and environment: ``sh wrapper.sh --env KEY COMMAND...`` (or, for a run accepted
    by an earlier version of the driver, ``sh wrapper.sh RUNFILE``). A run of another owner starts under
    ``setpriv`` with the owner's ids and environment, and notifies its owner's own events file."""
    base, bindir, notify = base_environ(), str(wrapper.parent), str(journal.events)
    out = []
    for run in batch:
        if run.spec is not None:
            try:
                who = identity(run.spec.owner)
            except OwnerError as exc:
                out.append(Start(run, [], {}, run.spec, problem=str(exc)))
                continue
            if who is None:  # the single-user way, unchanged
                out.append(Start(run, wrapper_argv(run.shell, wrapper, run.spec),
                                 wrapper_env(run.spec, base, bindir=bindir, notify=notify, boot=boot), run.spec))
                continue
            try:
                argv = [*switch_argv(who), *wrapper_argv(run.shell, wrapper, run.spec)]
                own = str(journal.owner_events(who.name, who.uid, who.gid))
                last_words = journal.owner_out(who.name, who.uid, who.gid)
            except (OwnerError, OSError) as exc:
                out.append(Start(run, [], {}, run.spec, problem=f"cannot run as owner {who.name}: {exc}"))
                continue
            env = wrapper_env(run.spec, who.env(base), bindir=bindir, notify=own, boot=boot)
            out.append(Start(run, argv, env, run.spec, owner=who, out=last_words))
        else:
            out.append(Start(run, [run.shell, str(wrapper), str(run.runfile)], dict(os.environ), None))
    return out
