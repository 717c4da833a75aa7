"""The slurm driver's base: its configuration, counters, and the one way it runs a Slurm command.

:class:`SlurmBase` holds what every part of :class:`~orch_slurm.SlurmDriver`
shares (the submit path in :mod:`orch_slurm.submit`, the lookup in
:mod:`orch_slurm.lookup`, monitoring and kill in the package itself), so
each part is a small mixin over it, as in the ssh driver.
"""

from __future__ import annotations

import os
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any

from orchestrator.plugin import Driver, DriverContext
from orchestrator.plugin.accounts import Account, argv_as
from orchestrator.plugin.wrapper import install_scripts

from .journal import Journal
from .settings import validate
from .slurm import LocalRunner, Result, Runner, SlurmError, parse_max_array_size


class SlurmBase(Driver):
    """State shared by the slurm driver's parts (see :mod:`orch_slurm`)."""

    def __init__(self, context: DriverContext) -> None:
        super().__init__(context)
        cfg = context.config
        self.bindir = context.home / "bin"
        self.wrapper = install_scripts(self.bindir)
        self.shell = str(cfg.get("shell", "/bin/sh"))
        self.command_timeout = float(cfg.get("command_timeout", 60.0))
        self.max_array_cap = int(cfg.get("max_array_size", 0))
        self.lost_after = float(cfg.get("lost_after_seconds", 600.0))
        self.default_conf: str | None = cfg.get("slurm_conf")
        #: ``submissions.log`` and the fences of each ``sbatch`` (see :mod:`orch_slurm.journal`).
        self.journal = Journal(context.statedir)
        #: ``sbatch`` names already used (this process's, and all the journal's once a lookup read it):
        #: a run sent again under its key after a lookup gets a name of its own.
        self._names: set[str] = set()
        self.log = context.log
        #: How commands are run (a test may put a fake here).
        self.runner: Runner = LocalRunner()
        #: Every Slurm command run, by name (``sbatch``, ``squeue``, ``sacct``, ``scancel``, ``scontrol``).
        self.calls: Counter[str] = Counter()
        #: The last commands, as argument lists.
        self.history: deque[tuple[str, ...]] = deque(maxlen=1000)
        #: Status queries (the core's monitoring ticks for this backend), each tick's commands and runs watched.
        self.ticks = 0
        self.tick_calls: deque[dict[str, int]] = deque(maxlen=100_000)
        self.tick_runs: deque[int] = deque(maxlen=100_000)
        self._max_array: dict[str | None, int] = {}
        self._killed: set[str] = set()
        self._unique: dict[str, str] = {}
        self._absent: dict[str, int] = {}
        self._silent_since: dict[str | None, float] = {}

    def metrics(self) -> dict[str, Any]:
        """Commands run (by name), the last ones, and per monitoring tick the commands and runs watched."""
        return {"calls": dict(self.calls), "history": [list(h) for h in self.history], "ticks": self.ticks,
                "tick_calls": list(self.tick_calls), "tick_runs": list(self.tick_runs)}

    @classmethod
    def validate_settings(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        return validate(settings)

    # --------------------------------------------------------------- commands
    def _conf(self, settings: Mapping[str, Any]) -> str | None:
        """The slurm.conf of these runs' cluster; ``None``: whatever the environment says."""
        conf = settings.get("slurm_conf") or self.default_conf
        return str(conf) if conf else None

    async def _cmd(self, conf: str | None, argv: list[str], tally: Counter[str] | None = None,
                   stdin: bytes | None = None, account: Account | None = None) -> Result:
        """Run a Slurm command; with ``account``, as that user (``sbatch``, ``scancel`` of an owner's runs: Slurm
        records and checks the owner, never the service's user)."""
        self.calls[argv[0]] += 1
        if tally is not None:
            tally[argv[0]] += 1
        self.history.append(tuple(argv))
        env = None if conf is None else {**os.environ, "SLURM_CONF": conf}
        return await self.runner([*argv_as(account), *argv], stdin=stdin, env=env, timeout=self.command_timeout)

    async def _array_size(self, conf: str | None) -> int:
        """Most tasks one ``sbatch --array`` may hold on this cluster (``MaxArraySize``; 0 disables arrays)."""
        size = self._max_array.get(conf)
        if size is None:
            res = await self._cmd(conf, ["scontrol", "show", "config"])
            if res.code != 0:
                raise SlurmError(f"scontrol show config exited with {res.code}: {res.err.strip()[-300:]}")
            found = parse_max_array_size(res.out)
            size = 1001 if found is None else found  # Slurm's default when the line is missing
            self._max_array[conf] = size
        if self.max_array_cap > 0:
            size = min(size, self.max_array_cap)
        return max(size, 1)

