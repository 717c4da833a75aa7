"""The slurm driver's lookup: runs caught mid-submission by a crash, found by their ``sbatch``'s name.

The journal (:mod:`orch_slurm.journal`) says which ``sbatch`` carried each
run's key and at which array index. An ``sbatch`` whose job id it recorded
is answered from it; the others are asked for by name: one ``squeue`` for
all of them (ended jobs stay listed for ``MinJobAge``), then, for those it
does not list, one ``sacct -c`` (the job-completion log). Each is held
(its tasks wait) while Slurm is asked, then released if found, else voided,
so that an ``sbatch`` still under way when the orchestrator died can never
start a run the core was told it may send again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

from orchestrator.plugin import RunSpec
from orchestrator.plugin.wrapper import read_log

from .base import SlurmBase
from .journal import Attempt
from .slurm import SlurmError

#: Characters of names per ``squeue -n`` (one argument; Linux caps one at 128 KiB).
_NAMES_PER_ARG = 60_000


class LookupMixin(SlurmBase):
    """Finding runs by key after a restart, and settling an ``sbatch`` that never answered."""

    async def lookup(self, runs: Sequence[RunSpec]) -> list[str | None]:
        """Each run's ``JOBID`` or ``JOBID_INDEX``, as :meth:`submit_bulk` returned it, or ``None``.

        ``None`` only when no ``sbatch`` of the run's key reached Slurm, or the one
        that may have is voided: none of its tasks can start the run any more.
        Raises :class:`SlurmError` when Slurm cannot be asked, or when a run's
        wrapper started under an ``sbatch`` Slurm no longer knows (it ran, but
        its id cannot be told).
        """
        attempts = self.journal.attempts()
        self._names.update(attempts)
        wanted = {run.key for run in runs}
        by_key: dict[str, list[Attempt]] = {}
        for attempt in attempts.values():
            for key in attempt.keys:
                if key in wanted:
                    by_key.setdefault(key, []).append(attempt)
        undecided: dict[str | None, dict[str, Attempt]] = {}
        for run in runs:
            for attempt in by_key.get(run.key, []):
                if attempt.job is None and not self.journal.voided(attempt.name):
                    undecided.setdefault(self._conf(run.settings), {})[attempt.name] = attempt
        started = {run.key for run in runs if read_log(run.outputdir, run.attempt, fqid=run.fqid).started is not None}
        found: dict[str, str] = {}
        for conf, group in undecided.items():
            found.update(await self._settle(conf, list(group.values()), ended=True,
                                            ran=lambda a: any(k in started for k in a.keys)))
        result: list[str | None] = []
        for run in runs:
            hits = [(a, job) for a in by_key.get(run.key, []) if (job := a.job or found.get(a.name))]
            result.append(hits[-1][0].backend_id(run.key, hits[-1][1]) if hits else None)
        return result

    async def _settle(self, conf: str | None, attempts: list[Attempt], *, ended: bool,
                      ran: Callable[[Attempt], bool] | None = None, void_on_error: bool = False) -> dict[str, str]:
        """Hold ``attempts``, ask Slurm for them; release those found (their job ids), void the others.

        ``ended``: ask ``sacct -c`` too, for jobs ``squeue`` no longer lists.
        ``ran(attempt)``: whether one of its runs' wrapper started: if Slurm knows
        nothing of such an attempt, raise rather than void (its runs did run).
        When Slurm cannot be asked, the holds are released (``void_on_error``:
        voided) and the error raised.
        """
        for attempt in attempts:
            self.journal.hold(attempt.name)
        try:
            found = await self._find_jobs(conf, [a.name for a in attempts], ended=ended)
            lost = [a.name for a in attempts if a.name not in found and ran is not None and ran(a)]
            if lost:
                raise SlurmError(f"Slurm no longer knows the job of {', '.join(lost)}, whose runs started: their "
                                 "job ids cannot be told (is the job-completion log, sacct -c, still there?)")
        except BaseException:
            for attempt in attempts:
                (self.journal.void if void_on_error else self.journal.release)(attempt.name)
            raise
        for attempt in attempts:
            job = found.get(attempt.name)
            if job is None:
                self.journal.void(attempt.name)
                continue
            self.journal.release(attempt.name)
            try:
                self.journal.done(job, attempt.name, attempt.keys)
            except OSError as exc:  # only the record: the next lookup finds the job by name again
                self.log.warning("slurm journal not written", name=attempt.name, job=job, error=str(exc))
        if found:
            self.log.info("slurm submissions found by name", jobs=dict(list(found.items())[:20]), count=len(found))
        return found

    async def _find_jobs(self, conf: str | None, names: list[str], *, ended: bool) -> dict[str, str]:
        """Name -> (array) job id of the jobs Slurm has under these names (its ``--comment``).

        A job counts only if it runs in this driver's state dir (its ``--chdir``): a job of
        another home, or another user's, under the same name is not ours.
        """
        wanted = set(names)
        found: dict[str, str] = {}
        for chunk in _chunks(names):
            res = await self._cmd(conf, ["squeue", "-h", "--states=all", "-n", ",".join(chunk), "-o", "%F|%k|%Z"])
            if res.code != 0:
                raise SlurmError(f"squeue exited with {res.code}: {res.err.strip()[-300:]}")
            for line in res.out.splitlines():
                job, _, tail = line.strip().partition("|")
                comment, _, workdir = tail.partition("|")
                if comment in wanted and job.isdigit() and self._ours(workdir):
                    found.setdefault(comment, job)
        rest = wanted - found.keys()
        if not ended or not rest:
            return found
        # ``sacct -c`` ignores --name: it reads the whole job-completion log, filtered here. An array's tasks
        # that ran are listed by their own ids; the array's id is the lowest (the last task to start keeps it).
        res = await self._cmd(conf, ["sacct", "-c", "-n", "-P", "-o", "JobID,JobName,WorkDir"])
        if res.code != 0:
            self.log.warning("sacct -c failed: ended jobs are judged by their runs' logs", code=res.code,
                             error=res.err.strip()[-300:])
            return found
        ids: dict[str, int] = {}
        for line in res.out.splitlines():
            job, _, tail = line.strip().partition("|")
            name, _, workdir = tail.partition("|")
            if name in rest and job.isdigit() and self._ours(workdir):
                ids[name] = min(ids.get(name, int(job)), int(job))
        return found | {name: str(job) for name, job in ids.items()}

    def _ours(self, workdir: str) -> bool:
        """Whether a job's work dir is this driver's state dir (an answer without one is taken at its word)."""
        return not workdir or os.path.realpath(workdir) == os.path.realpath(self.context.statedir)


def _chunks(names: list[str]) -> Iterator[list[str]]:
    chunk: list[str] = []
    size = 0
    for name in names:
        if chunk and size + len(name) + 1 > _NAMES_PER_ARG:
            yield chunk
            chunk, size = [], 0
        chunk.append(name)
        size += len(name) + 1
    if chunk:
        yield chunk
