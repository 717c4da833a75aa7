"""``slurm``: run subjobs on a Slurm cluster, a master's subjobs as one job array, through the job wrapper.

``Backend("slurm", partition="debug", time="30", mem="2G", cpus=1, account=..., qos=...,
sbatch_args=[...], slurm_conf="/path/slurm.conf")``; every setting is optional.

* **Bulk submission is one ``sbatch --array=0-N``** per group of runs with
  the same resources (a splitter may vary ``backend.time``, ``backend.mem``,
  ... per subjob), chunked under the cluster's ``MaxArraySize`` (read once
  from ``scontrol show config``). The array's script is pure ``sh``: the
  task id picks the run's dir in a ``case`` and ``exec``s ``sh wrapper.sh
  RUNFILE``. Run files are written with the core's wrapper helpers into the
  run's dir in the home, which the compute nodes must share (as the one
  node of the test cluster does). A lone run (a resubmitted subjob, an
  automatic retry) is one plain ``sbatch``. The batch's idempotency key
  (the run's own key, or a digest of an array's keys) goes in
  ``--job-name`` and ``--comment``; when ``sbatch`` hangs, the driver looks
  the key up before it calls the batch failed, so a slow controller never
  makes a run start twice. ``--no-requeue``: the orchestrator, not Slurm,
  decides whether a run that met a node failure runs again.
* **Every ``sbatch`` is journalled** in the driver's state dir before it is
  sent and once it answered (``journal.py``), so that after a crash
  ``lookup`` finds each run caught mid-submission by its key: the journal
  names its ``sbatch`` and array index, one ``squeue`` (and one ``sacct -c``
  for ended jobs) finds the job by name, and an ``sbatch`` Slurm does not
  have is voided by a fence its script checks, so it can never start a run
  the core sends again (``lookup.py``).
* **Monitoring is one ``squeue`` per tick** for every run of the driver,
  whatever their number (``squeue -h -r --states=all -j ARRAYS``: ended jobs
  stay listed for ``MinJobAge``); runs it no longer lists are looked up with
  one ``sacct -c`` (the job-completion log), else judged from the wrapper's
  log. ``calls`` counts every command by name; ``tick_calls`` holds each
  tick's commands.
* **States**: PENDING → submitted, RUNNING → running, COMPLETED →
  completed, FAILED → failed (both then judged from ``orch.log`` by the
  core), TIMEOUT / NODE_FAIL / OUT_OF_MEMORY → failed, judged from the log
  when the wrapper started (over its time limit: START without END, worker
  level), else ``backend_verdict="aborted"``. CANCELLED by this driver →
  killed; CANCELLED by anyone else (an administrator, the system) or
  PREEMPTED → held, ``backend_verdict="cancelled"``: Slurm does not record
  who cancelled, so "not us" is the line drawn.
* **Kill** is one ``scancel JOBID_TASK ...`` for all the runs asked: one
  array task, never its siblings.

``[backends.slurm]`` in the configuration may set ``slurm_conf`` (else
``SLURM_CONF`` of the environment), ``shell`` (``/bin/sh``),
``command_timeout`` (60 s), ``max_array_size`` (a cap below the cluster's)
and ``lost_after_seconds`` (600, for a cluster silent while others answer).
``via="ssh"`` is refused at ``add()`` with a clear message until runs can be
staged to a remote cluster's file system. Written against the public
driver API only.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from orchestrator.plugin import Capabilities, JobStatus, RunHandle, StatusUpdate
from orchestrator.plugin.accounts import AccountError, account_of
from orchestrator.plugin.users import read_inside
from orchestrator.plugin.wrapper import RunLog, read_log, top_dir

from .slurm import (
    ABORTED,
    ACTIVE,
    FAILED,
    OVER_MEMORY,
    QUEUED,
    SACCT_FIELDS,
    SLURM_OUT,
    SQUEUE_FORMAT,
    JobRef,
    Row,
    SlurmError,
    parse_sacct,
    parse_scancel_errors,
    parse_squeue,
)
from .submit import SubmitMixin

__all__ = ["SlurmDriver", "SlurmError"]

#: Ticks a run may be missing from ``squeue`` before it is looked up elsewhere (one answer is not proof).
ABSENT_TICKS = 2


class SlurmDriver(SubmitMixin):
    """The ``slurm`` backend: submit and lookup are its mixins (over ``base.SlurmBase``); monitoring and kill here."""

    name = "slurm"
    capabilities = Capabilities(bulk_submit=True, bulk_kill=True, bulk_status=True, runs_wrapper=True, lookup=True)

    # ----------------------------------------------------------------- status
    async def status(self, handle: RunHandle) -> StatusUpdate | None:
        updates = await self.status_bulk([handle])
        return updates[0] if updates else None

    async def status_bulk(self, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        """One ``squeue`` per cluster (one in all, as a rule) for every run, plus ``sacct -c`` for vanished ones."""
        self.ticks += 1
        tally: Counter[str] = Counter()
        watched = {h.backend_id for h in handles}
        for memo in (self._unique, self._absent):  # forget runs the core no longer watches
            for stale in [k for k in memo if k not in watched]:
                del memo[stale]
        self._killed &= watched
        updates: list[StatusUpdate] = []
        groups: dict[str | None, list[tuple[RunHandle, JobRef]]] = {}
        for h in handles:
            try:
                ref = JobRef.parse(h.backend_id)
            except ValueError as bad:
                updates.append(StatusUpdate(h.fqid, JobStatus.FAILED, reason=f"lost: {bad}", backend_verdict="lost"))
                continue
            groups.setdefault(self._conf(h.settings), []).append((h, ref))
        errors: dict[str | None, SlurmError] = {}
        for conf, items in groups.items():
            try:
                updates += await self._poll(conf, items, tally)
            except SlurmError as failure:
                errors[conf] = failure
            else:
                self._silent_since.pop(conf, None)
        self.tick_calls.append(dict(tally))
        self.tick_runs.append(len(handles))
        if errors and len(errors) == len(groups):
            raise SlurmError("; ".join(str(e) for e in errors.values()))  # the core backs off, counts lost_after
        now = time.monotonic()
        for conf, error in errors.items():  # others answered: this cluster's silence is counted here
            since = self._silent_since.setdefault(conf, now)
            if now - since >= self.lost_after:
                reason = f"Slurm ({conf or 'SLURM_CONF'}) did not answer for {now - since:.0f} s: {error}"
                updates += [StatusUpdate(h.fqid, JobStatus.FAILED, reason=reason, backend_verdict="lost")
                            for h, _ in groups[conf]]
        return updates

    async def _poll(self, conf: str | None, items: list[tuple[RunHandle, JobRef]],
                    tally: Counter[str]) -> list[StatusUpdate]:
        jobs = sorted({ref.job for _, ref in items}, key=int)
        res = await self._cmd(conf, ["squeue", "-h", "-r", "--states=all", "-o", SQUEUE_FORMAT, "-j", ",".join(jobs)],
                              tally)
        if res.code != 0 and "invalid job id" not in res.err.lower():  # (one unknown id alone makes it exit 1)
            raise SlurmError(f"squeue exited with {res.code}: {res.err.strip()[-300:]}")
        rows = parse_squeue(res.out)
        listed = {key.partition("_")[0] for key in rows}
        updates: list[StatusUpdate] = []
        lookups: list[tuple[RunHandle, JobRef, str]] = []
        for h, ref in items:
            row = rows.get(ref.key)
            if row is not None:
                self._absent.pop(h.backend_id, None)
                if row.unique and row.state not in QUEUED:
                    self._unique[h.backend_id] = row.unique
                update = self._judge_row(h, row)
            else:
                update, unique = self._vanished(h, ref, ref.job in listed)
                if unique is not None:
                    lookups.append((h, ref, unique))
            if update is not None:
                updates.append(update)
        if lookups:
            found: dict[str, Row] = {}
            res = await self._cmd(conf, ["sacct", "-c", "-n", "-P", "-o", SACCT_FIELDS, "-j",
                                         ",".join(sorted({u for _, _, u in lookups}, key=int))], tally)
            if res.code == 0:
                found = parse_sacct(res.out)
            for h, ref, unique in lookups:
                row = found.get(unique)
                update = self._judge_row(h, row) if row is not None else self._unknown(h, ref, False)
                if update is not None:
                    updates.append(update)
        return updates

    def _vanished(self, h: RunHandle, ref: JobRef, array_listed: bool) -> tuple[StatusUpdate | None, str | None]:
        """A run ``squeue`` does not list: an update now, or the job id to ask ``sacct -c`` about."""
        if h.backend_id in self._killed:
            return StatusUpdate(h.fqid, JobStatus.KILLED, reason="killed"), None
        log = read_log(h.outputdir, h.attempt, fqid=h.fqid)
        if log.finished:  # the wrapper's own word is there: no need to ask anyone
            return _by_log(h, log, "the wrapper ended"), None
        seen = self._absent[h.backend_id] = self._absent.get(h.backend_id, 0) + 1
        if seen < ABSENT_TICKS:
            return None, None
        unique = self._unique.get(h.backend_id) or (ref.job if ref.task is None else None)
        if unique is not None:
            return None, unique
        return self._unknown(h, ref, array_listed), None

    def _unknown(self, h: RunHandle, ref: JobRef, array_listed: bool) -> StatusUpdate | None:
        """Neither ``squeue`` nor ``sacct -c`` knows the run: judge it by what its wrapper left."""
        log = read_log(h.outputdir, h.attempt, fqid=h.fqid)
        if log.finished:
            return _by_log(h, log, "the wrapper ended")
        if log.started is not None:
            return StatusUpdate(h.fqid, JobStatus.FAILED,
                                reason="Slurm no longer knows the job; its wrapper started but never ended (killed "
                                       "with its node or its job)")
        if array_listed and ref.task is not None:
            # Pending tasks cancelled one by one leave no record at all, while their siblings are listed.
            return StatusUpdate(h.fqid, JobStatus.HELD,
                                reason="the array task left the queue before it started: cancelled outside the "
                                       "orchestrator", backend_verdict="cancelled")
        return StatusUpdate(h.fqid, JobStatus.FAILED, reason="Slurm has no record of the job and it left no log",
                            backend_verdict="lost")

    def _judge_row(self, h: RunHandle, row: Row) -> StatusUpdate | None:
        """The report for a run in ``row``'s Slurm state, or ``None`` when the core knows it already."""
        state = row.state
        if state in QUEUED:
            return None  # submitted (a requeued run never moves back from running)
        if state in ACTIVE:
            return None if h.status == JobStatus.RUNNING else StatusUpdate(h.fqid, JobStatus.RUNNING)
        if state == "COMPLETED":
            return StatusUpdate(h.fqid, JobStatus.COMPLETED, exit_code=0)
        if state == "CANCELLED" and h.backend_id in self._killed:
            return StatusUpdate(h.fqid, JobStatus.KILLED, reason="killed")
        if state in ("CANCELLED", "PREEMPTED"):
            what = "cancelled" if state == "CANCELLED" else "preempted"
            return StatusUpdate(h.fqid, JobStatus.HELD,
                                reason=f"Slurm: {state} ({what} outside the orchestrator, by an administrator or the "
                                       "system)", backend_verdict="cancelled")
        log = read_log(h.outputdir, h.attempt, fqid=h.fqid)
        code = log.exit_code if log.exit_code is not None else row.exit_code
        if state in FAILED and _over_memory(h):
            verdict = None if log.started is not None else "aborted"
            return StatusUpdate(h.fqid, JobStatus.FAILED, exit_code=code, backend_verdict=verdict,
                                reason="Slurm: OUT_OF_MEMORY (killed over its memory limit, says slurm.out)")
        if state in FAILED:
            why = "" if log.started is not None else " before the wrapper started (see wrapper.out)"
            return StatusUpdate(h.fqid, JobStatus.FAILED, exit_code=code, reason=f"Slurm: {state}{why}")
        if state in ABORTED:
            reason = f"Slurm: {state} ({ABORTED[state]})"
            # The wrapper started: its log tells how far the run got (no END: worker level). Else Slurm's word.
            verdict = None if log.started is not None else "aborted"
            return StatusUpdate(h.fqid, JobStatus.FAILED, exit_code=code, reason=reason, backend_verdict=verdict)
        self.log.warning("unknown Slurm job state; run left as it is", fqid=h.fqid, backend_id=h.backend_id,
                         state=state)
        return None

    # ------------------------------------------------------------------- kill
    async def kill(self, handle: RunHandle) -> None:
        error = (await self.kill_bulk([handle]))[0]
        if error:
            raise SlurmError(error)

    async def kill_bulk(self, handles: Sequence[RunHandle]) -> list[str | None]:
        """One ``scancel`` per cluster for every run asked: ``JOBID_TASK`` cancels that array task only."""
        results: list[str | None] = [None] * len(handles)
        groups: dict[tuple[str | None, str | None], list[tuple[int, JobRef]]] = {}
        for i, h in enumerate(handles):
            try:
                groups.setdefault((self._conf(h.settings), h.owner), []).append((i, JobRef.parse(h.backend_id)))
            except ValueError as exc:
                results[i] = str(exc)
        for (conf, owner), items in groups.items():
            keys = [ref.key for _, ref in items]
            self._killed.update(keys)  # before the call: a tick that sees CANCELLED meanwhile knows it was us
            try:
                try:
                    account = account_of(owner)  # an owner's runs are cancelled by the owner
                except AccountError as exc:
                    raise SlurmError(str(exc)) from None
                res = await self._cmd(conf, ["scancel", *keys], account=account)
                if res.code != 0 and not parse_scancel_errors(res.err):
                    raise SlurmError(f"scancel exited with {res.code}: {res.err.strip()[-300:]}")
            except SlurmError as exc:
                self._killed.difference_update(keys)
                for i, _ in items:
                    results[i] = str(exc)
                continue
            refused = parse_scancel_errors(res.err)
            for i, ref in items:
                if ref.key in refused:
                    self._killed.discard(ref.key)
                    results[i] = f"scancel {ref.key}: {refused[ref.key]}"
        return results


def _by_log(h: RunHandle, log: RunLog, why: str) -> StatusUpdate:
    """A run Slurm no longer lists but whose wrapper wrote END: the log's exit code decides."""
    code = log.exit_code if log.exit_code is not None else log.end_code
    if code == 0:
        return StatusUpdate(h.fqid, JobStatus.COMPLETED, exit_code=0)
    return StatusUpdate(h.fqid, JobStatus.FAILED, exit_code=code, reason=f"{why} with exit code {code}")


def _over_memory(h: RunHandle) -> bool:
    """Whether Slurm's own word to the run (its ``slurm.out``) says it was killed over its memory limit."""
    try:  # (as any file a run made: no link out of the job's dir, a regular file only, never a FIFO waited on)
        tail = read_inside(h.outputdir.parent / SLURM_OUT, top_dir(h.outputdir, h.fqid), 4096).decode(errors="replace")
    except OSError:
        return False
    return any(sign in tail for sign in OVER_MEMORY)
