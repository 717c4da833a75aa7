"""The slurm driver's submit path: run files in the home, then one ``sbatch`` (an array) per group of runs.

Each ``sbatch`` is written to the journal before it is sent and after it
answered (:mod:`orch_slurm.journal`), under a name unique to it (its
``--job-name`` and ``--comment``: the batch key, with a nonce when a run is
sent again under its key after a lookup), and its script honours the
fences a lookup puts up. An ``sbatch`` that hangs is settled the way a
lookup settles one after a crash: found by name, or voided, never sent twice.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from orchestrator.plugin import RunSpec, SubmitError, SubmitOutcome
from orchestrator.plugin.accounts import Account, AccountError, account_of, give
from orchestrator.plugin.wrapper import KEPT, RUNFILE, clear_outputs, prepare_local, render_runfile

from .journal import Attempt
from .lookup import LookupMixin
from .settings import resources_key, sbatch_options
from .slurm import SLURM_OUT, SlurmError, SlurmTimeout, batch_key, batch_script, parse_job_id


class SubmitMixin(LookupMixin):
    """Preparing runs and submitting them with ``sbatch``."""

    # ----------------------------------------------------------------- submit
    async def submit(self, run: RunSpec) -> str:
        outcome = (await self.submit_bulk([run]))[0]
        if not outcome.ok or outcome.backend_id is None:
            raise SubmitError(outcome.error or "submission refused")
        return outcome.backend_id

    def _prepare(self, run: RunSpec, account: Account | None = None) -> Path:
        """The run's dirs, input links and run file, in its dir in the home (shared with the compute nodes); an
        owner's run writes them as the owner (Slurm starts it as the owner), so they are made the owner's."""
        clear_outputs(run.outputdir)
        runfile = prepare_local(run, bindir=self.bindir)
        # Compute nodes booted at other times than this machine: without ORCH_BOOT the wrapper's clock is `date`.
        runfile.write_text(render_runfile(run, bindir=str(self.bindir)))
        give(account, run.jobdir, run.outputdir, run.workdir, runfile,
             *(p for p in run.outputdir.iterdir() if p.name in KEPT))
        return runfile

    async def submit_bulk(self, runs: Sequence[RunSpec]) -> list[SubmitOutcome]:
        """One ``sbatch`` per group of equal resources (an array, chunked under MaxArraySize); raise if none went."""
        outcomes: dict[str, SubmitOutcome] = {}
        groups: dict[tuple[Any, ...], list[tuple[RunSpec, Path]]] = {}
        accounts: dict[str | None, Account | None] = {}
        for i, run in enumerate(runs):
            try:
                if run.owner not in accounts:
                    accounts[run.owner] = account_of(run.owner)
                runfile = self._prepare(run, accounts[run.owner])
            except (OSError, AccountError) as exc:
                outcomes[run.fqid] = SubmitOutcome(run.fqid, None, f"preparing the run: {exc}")
                continue
            groups.setdefault((resources_key(run.settings), run.owner), []).append((run, runfile))
            if i % 256 == 255:
                await anyio.sleep(0)  # thousands of run files: let the loop breathe
        for group in groups.values():
            conf = self._conf(group[0][0].settings)
            account = accounts[group[0][0].owner]
            try:
                size = await self._array_size(conf) if len(group) > 1 else 1
            except SlurmError as exc:
                for run, _ in group:
                    outcomes[run.fqid] = SubmitOutcome(run.fqid, None, str(exc))
                continue
            for start in range(0, len(group), size):
                await self._sbatch(conf, group[start:start + size], outcomes, account)
        result = [outcomes[r.fqid] for r in runs]
        if result and not any(o.ok for o in result):  # nothing went anywhere: a clean failure of the whole call
            raise SubmitError(next((o.error for o in result if o.error), "submission refused"))
        return result

    def _output(self, name: str, jobdirs: list[Path]) -> str:
        try:
            return self._slurm_out(name, jobdirs)
        except OSError as exc:  # Slurm's word is then lost, not the run
            self.log.warning("cannot link the runs' slurm.out", error=str(exc))
            return "/dev/null"

    def _slurm_out(self, name: str, jobdirs: list[Path]) -> str:
        """Where Slurm writes what it says to a task (``slurmstepd: error: Exceeded job memory limit``): each run's
        ``slurm.out``. An array's ``%a`` names a link to it, in a dir of the submission's own."""
        if len(jobdirs) == 1:
            return str(jobdirs[0] / SLURM_OUT).replace("%", "%%")
        links = self.context.statedir / "out" / name
        links.mkdir(parents=True, exist_ok=True)
        for i, jobdir in enumerate(jobdirs):
            link = links / str(i)
            link.unlink(missing_ok=True)
            link.symlink_to(jobdir / SLURM_OUT)
        return f"{str(links).replace('%', '%%')}/%a"

    async def _sbatch(self, conf: str | None, chunk: list[tuple[RunSpec, Path]],
                      outcomes: dict[str, SubmitOutcome], account: Account | None = None) -> None:
        runs = [run for run, _ in chunk]
        keys = [r.key for r in runs]
        name = batch_key(keys)
        while name in self._names:  # sent before under this key and voided by a lookup: a name of its own
            name = f"{batch_key(keys)}+{secrets.token_hex(4)}"
        self._names.add(name)
        argv = ["sbatch", "--parsable", "--no-requeue", f"--job-name={name}", f"--comment={name}",
                f"--output={self._output(name, [rf.parent for _, rf in chunk])}",
                f"--chdir={self.context.statedir if account is None else chunk[0][1].parent}",
                *sbatch_options(runs[0].settings)]
        if len(runs) > 1:
            argv.append(f"--array=0-{len(runs) - 1}")
        script = batch_script(self.shell, self.wrapper, [rf.parent for _, rf in chunk], RUNFILE,
                              fence=self.journal.fence(name))
        try:
            self.journal.intent(name, keys)
        except OSError as exc:  # not on disk: a lookup after a crash could not find it, so it is not sent
            for run in runs:
                outcomes[run.fqid] = SubmitOutcome(run.fqid, None, f"cannot write the submission journal: {exc}")
            return
        try:
            try:
                res = await self._cmd(conf, argv, stdin=script.encode(), account=account)
            except SlurmTimeout as timeout:
                # It may have gone in all the same: found by its name, or voided; never submitted twice.
                try:
                    found = await self._settle(conf, [Attempt(name, tuple(keys))], ended=False, void_on_error=True)
                except SlurmError:
                    raise timeout from None
                if name not in found:
                    raise
                job = found[name]
            else:
                if res.code != 0:
                    raise SlurmError(f"sbatch exited with {res.code}: {res.err.strip()[-500:]}")
                job = parse_job_id(res.out)
                try:
                    self.journal.done(job, name, keys)
                except OSError as exc:  # only the record: a lookup finds the job by its name
                    self.log.warning("slurm journal not written", name=name, job=job, error=str(exc))
        except SlurmError as exc:
            for run in runs:
                outcomes[run.fqid] = SubmitOutcome(run.fqid, None, str(exc))
            return
        ids = [job] if len(runs) == 1 else [f"{job}_{i}" for i in range(len(runs))]
        for run, backend_id in zip(runs, ids, strict=True):
            outcomes[run.fqid] = SubmitOutcome(run.fqid, backend_id)
