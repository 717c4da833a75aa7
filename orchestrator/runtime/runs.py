"""What a run finds where it runs, and what it leaves behind there.

:class:`RunFiles` is the one piece the actors and the monitors ask about a
run's files: the state a run starts from (written before it is sent), the
states a running run saved, and what an ended run left (:func:`read_ending`:
its wrapper log and the tail of its stderr, with its last saved states).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.machine import StateMachine
from ..core.runlog import RunLog, parse_log
from ..core.usage import USAGE_FILE, Attempt, parse_usage
from ..plugin.contract import RunHandle, RunSpec
from ..plugin.users import read_inside
from ..plugin.wrapper import LOG_HEAD, LOG_READ, log_path
from .checkpoints import Checkpoints
from .definitions import Definitions

#: Lines of stderr a failure's reason quotes, and the longest line kept.
STDERR_LINES = 3
STDERR_WIDTH = 200


@dataclass
class Ending:
    """What a run left behind, read once it ended (for drivers that run the wrapper)."""

    log: RunLog | None = None
    stderr_tail: str | None = None
    state: dict[str, Any] | None = None
    usage: dict[str, float] | None = None


class RunFiles:
    """The files of the runs of one home: their starting states, the states they save, what they leave."""

    def __init__(self, sm: StateMachine, definitions: Definitions, checkpoints: Checkpoints) -> None:
        self.sm = sm
        self.definitions = definitions
        self.checkpoints = checkpoints

    async def prepare(self, job: int, runs: Sequence[RunSpec], start: str, given: str | None
                      ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        """Each run's starting state, written into its work dir (:meth:`Checkpoints.prepare`)."""
        if start != "given" and self.harvestable(job) == []:  # no steps, no state saved: nothing to start from
            return {}, {}
        return await self.checkpoints.prepare(runs, start, given)

    def ending(self, handle: RunHandle) -> Ending:
        """What an ended run left: its log, its stderr's tail, its last saved states (a blocking read)."""
        ending = read_ending(handle)
        # Every run's: a job without steps may have saved states (one failed open when it saved none).
        ending.state = self.checkpoints.harvest(handle.fqid, handle.jobdir, final=True)
        return ending

    def harvestable(self, job: int) -> Collection[int | None] | None:
        """The runs of ``job`` that may have saved states: all (``None``) when it has steps, else those that saved
        one already (a run of a job without steps is not concerned until then, :meth:`Checkpoints.concerned`)."""
        if self.definitions.spec(job).get("steps") is not None:
            return None
        saved = self.sm.checkpointed(job)
        return saved if self.sm.is_master(job) else [None] if saved else []

    def harvest(self, handle: RunHandle) -> dict[str, Any] | None:
        """The states a running run saved since the last look (any run: the monitor chooses which to look at)."""
        return self.checkpoints.harvest(handle.fqid, handle.jobdir)


def read_ending(handle: RunHandle) -> Ending:
    """The run's log and stderr tail, from its output dir (a blocking read: the monitor runs it in a thread). Of a
    log over a MiB, its first 64 KiB and its last MiB (:data:`~orchestrator.plugin.wrapper.LOG_READ`): a run's
    log of millions of lines took seconds of the service's CPU and gigabytes of its memory, run after run.

    The attempt's own log, ``orch.<attempt>.log``, is renamed ``orch.log`` once read: the name users
    look for after a run ended. Both are read without following a link out of the output dir (the run's
    owner may have made them links to files only the orchestrator may read): such a file counts as missing.
    """
    out = handle.outputdir
    path = log_path(out, handle.attempt)
    # inside the top-level job's dir, which only the orchestrator may replace (all below may be the owner's)
    top = handle.jobdir.parent if "." in handle.fqid else handle.jobdir
    try:  # (a read-only output dir: the attempt's name stays)
        log = parse_log(read_inside(path, top, LOG_READ, head=LOG_HEAD,
                                    rename_to=None if path.name == "orch.log" else "orch.log").decode(errors="replace"))
    except OSError:
        log = None
    return Ending(log=log, stderr_tail=stderr_tail(out / "stderr", top))


def read_usage(outputdir: Path, subjob: bool) -> list[Attempt] | None:
    """A run's ``orch.usage`` records (``None``: none to read), read as any file the run wrote: inside the
    top-level job's dir (``subjob``: ``outputdir`` is a subjob's), never through a link, bounded."""
    top = outputdir.parent.parent if subjob else outputdir.parent
    try:
        return parse_usage(read_inside(outputdir / USAGE_FILE, top).decode(errors="replace"))
    except OSError:
        return None


def stderr_tail(path: Path, within: Path | None = None, lines: int = STDERR_LINES) -> str | None:
    """The last non-empty lines of a file, joined with " | ", or ``None``."""
    try:
        if (found := os.lstat(path)).st_size == 0 and stat.S_ISREG(found.st_mode):  # as most: one call, no read
            return None
    except OSError:
        return None
    try:
        data = read_inside(path, within or path.parent, 4096).decode(errors="replace")
    except OSError:
        return None
    kept = [line.strip()[:STDERR_WIDTH] for line in data.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or None
