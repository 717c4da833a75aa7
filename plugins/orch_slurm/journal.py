"""The slurm driver's submission journal and the fences that void an ``sbatch`` nobody answered for.

Why a journal: one ``sbatch --array`` carries many runs under one name (a
digest of their keys), so Slurm alone cannot say which job holds a given
run's key. Each ``sbatch`` is written to ``submissions.log`` in the driver's
state dir *before* it is sent (``T - NAME KEY...``, synced to disk) and again
with its job id once Slurm answered (``T JOB NAME KEY...``): the keys in
order, so task ``i`` of the array is the run of the ``i``-th key. After a
crash between the two, the job is found by ``NAME`` (its ``--job-name`` and
``--comment``), which is unique per ``sbatch``.

Why fences: an ``sbatch`` under way when the orchestrator died may still
reach the controller after a lookup found nothing, or may be pending
there while the lookup asks. Every batch script starts by waiting while
``fences/NAME.hold`` exists and ends at once, before the wrapper, if
``fences/NAME.void`` exists. A lookup puts the hold up *before* it asks
Slurm, then takes it down (the job was found: it runs) or renames it to the
void (found nowhere: it never will). A rename is atomic, so a task sees the
hold, the void, or neither; and a task that got past the check is running,
so Slurm lists it to the lookup that asks after the hold went up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Attempt:
    """One ``sbatch`` as the journal tells it: its name, its runs' keys in task order, its job id if known."""

    name: str
    keys: tuple[str, ...]
    job: str | None = None

    def backend_id(self, key: str, job: str) -> str:
        """The id :meth:`submit_bulk` returns for the run of ``key`` in this ``sbatch`` (job ``job``)."""
        return job if len(self.keys) == 1 else f"{job}_{self.keys.index(key)}"


class Journal:
    """``submissions.log`` and ``fences/`` in the driver's state dir (shared with the compute nodes)."""

    def __init__(self, statedir: Path) -> None:
        self.path = statedir / "submissions.log"
        self.fences = statedir / "fences"

    # ---------------------------------------------------------------- lines
    def intent(self, name: str, keys: Iterable[str]) -> None:
        """Before ``sbatch``: on disk (fsync) so a lookup after any crash knows to look for ``name``."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"{time.time():.3f} - {name} {' '.join(keys)}\n")
            f.flush()
            os.fsync(f.fileno())

    def done(self, job: str, name: str, keys: Iterable[str]) -> None:
        """Slurm's job id for ``name`` (after ``sbatch`` answered, or a lookup found it)."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"{time.time():.3f} {job} {name} {' '.join(keys)}\n")

    def attempts(self) -> dict[str, Attempt]:
        """Every ``sbatch`` the journal tells of, by name, in the order they were sent."""
        out: dict[str, Attempt] = {}
        try:
            text = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return out
        for line in text.splitlines():
            words = line.split()
            if len(words) < 4 or not (words[1] == "-" or words[1].isdigit()):
                continue  # (a line cut short by a crash)
            name, keys = words[2], tuple(words[3:])
            attempt = out.setdefault(name, Attempt(name, keys))
            if words[1] != "-":
                attempt.job = words[1]
        return out

    # --------------------------------------------------------------- fences
    def fence(self, name: str) -> str:
        """The path prefix the batch script of ``name`` checks (``.hold``, ``.void``)."""
        return str(self.fences / name)

    def hold(self, name: str) -> None:
        self.fences.mkdir(parents=True, exist_ok=True)
        Path(f"{self.fence(name)}.hold").touch()

    def release(self, name: str) -> None:
        Path(f"{self.fence(name)}.hold").unlink(missing_ok=True)

    def void(self, name: str) -> None:
        """No task of ``name`` may start the wrapper any more (the hold becomes the void, atomically)."""
        hold, void = Path(f"{self.fence(name)}.hold"), Path(f"{self.fence(name)}.void")
        try:
            hold.rename(void)
        except FileNotFoundError:
            self.fences.mkdir(parents=True, exist_ok=True)
            void.touch()

    def voided(self, name: str) -> bool:
        return Path(f"{self.fence(name)}.void").exists()
