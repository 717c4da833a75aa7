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

import os
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio

from orchestrator import (
    Capabilities,
    Driver,
    DriverContext,
    JobStatus,
    RunHandle,
    RunSpec,
    StatusUpdate,
    SubmitError,
    SubmitOutcome,
)
from orchestrator.wrapper import (
    RUNFILE,
    RunLog,
    clear_outputs,
    install_scripts,
    prepare_local,
    read_log,
    render_runfile,
)

from .settings import resources_key, sbatch_options, validate
from .slurm import (
    ABORTED,
    ACTIVE,
    FAILED,
    QUEUED,
    SACCT_FIELDS,
    SQUEUE_FORMAT,
    JobRef,
    LocalRunner,
    Result,
    Row,
    Runner,
    SlurmError,
    SlurmTimeout,
    batch_key,
    batch_script,
    parse_job_id,
    parse_max_array_size,
    parse_sacct,
    parse_scancel_errors,
    parse_squeue,
)

__all__ = ["SlurmDriver", "SlurmError"]

S = JobStatus
#: Ticks a run may be missing from ``squeue`` before it is looked up elsewhere (one answer is not proof).
ABSENT_TICKS = 2


class SlurmDriver(Driver):
    name = "slurm"
    capabilities = Capabilities(bulk_submit=True, bulk_kill=True, bulk_status=True, runs_wrapper=True)

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
        self.journal = context.statedir / "submissions.log"
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

    @classmethod
    def validate_settings(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        return validate(settings)

    # --------------------------------------------------------------- commands
    def _conf(self, settings: Mapping[str, Any]) -> str | None:
        """The slurm.conf of these runs' cluster; ``None``: whatever the environment says."""
        conf = settings.get("slurm_conf") or self.default_conf
        return str(conf) if conf else None

    async def _cmd(self, conf: str | None, argv: list[str], tally: Counter[str] | None = None,
                   stdin: bytes | None = None) -> Result:
        self.calls[argv[0]] += 1
        if tally is not None:
            tally[argv[0]] += 1
        self.history.append(tuple(argv))
        env = None if conf is None else {**os.environ, "SLURM_CONF": conf}
        return await self.runner(argv, stdin=stdin, env=env, timeout=self.command_timeout)

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

    # ----------------------------------------------------------------- submit
    async def submit(self, run: RunSpec) -> str:
        outcome = (await self.submit_bulk([run]))[0]
        if not outcome.ok or outcome.backend_id is None:
            raise SubmitError(outcome.error or "submission refused")
        return outcome.backend_id

    def _prepare(self, run: RunSpec) -> Path:
        """The run's dirs, input links and run file, in its dir in the home (shared with the compute nodes)."""
        clear_outputs(run.outputdir)
        runfile = prepare_local(run, bindir=self.bindir)
        # Compute nodes booted at other times than this machine: without ORCH_BOOT the wrapper's clock is `date`.
        runfile.write_text(render_runfile(run, bindir=str(self.bindir)))
        return runfile

    async def submit_bulk(self, runs: Sequence[RunSpec]) -> list[SubmitOutcome]:
        """One ``sbatch`` per group of equal resources (an array, chunked under MaxArraySize); raise if none went."""
        outcomes: dict[str, SubmitOutcome] = {}
        groups: dict[tuple[Any, ...], list[tuple[RunSpec, Path]]] = {}
        for i, run in enumerate(runs):
            try:
                runfile = self._prepare(run)
            except OSError as exc:
                outcomes[run.fqid] = SubmitOutcome(run.fqid, None, f"preparing the run: {exc}")
                continue
            groups.setdefault(resources_key(run.settings), []).append((run, runfile))
            if i % 256 == 255:
                await anyio.sleep(0)  # thousands of run files: let the loop breathe
        for group in groups.values():
            conf = self._conf(group[0][0].settings)
            try:
                size = await self._array_size(conf) if len(group) > 1 else 1
            except SlurmError as exc:
                for run, _ in group:
                    outcomes[run.fqid] = SubmitOutcome(run.fqid, None, str(exc))
                continue
            for start in range(0, len(group), size):
                await self._sbatch(conf, group[start:start + size], outcomes)
        result = [outcomes[r.fqid] for r in runs]
        if result and not any(o.ok for o in result):  # nothing went anywhere: a clean failure of the whole call
            raise SubmitError(next((o.error for o in result if o.error), "submission refused"))
        return result

    async def _sbatch(self, conf: str | None, chunk: list[tuple[RunSpec, Path]],
                      outcomes: dict[str, SubmitOutcome]) -> None:
        runs = [run for run, _ in chunk]
        key = batch_key([r.key for r in runs])
        argv = ["sbatch", "--parsable", "--no-requeue", f"--job-name={key}", f"--comment={key}",
                "--output=/dev/null", f"--chdir={self.context.statedir}", *sbatch_options(runs[0].settings)]
        if len(runs) > 1:
            argv.append(f"--array=0-{len(runs) - 1}")
        script = batch_script(self.shell, self.wrapper, [rf.parent for _, rf in chunk], RUNFILE)
        try:
            try:
                res = await self._cmd(conf, argv, stdin=script.encode())
            except SlurmTimeout:
                job = await self._find(conf, key)  # it may have gone in all the same: never submit a run twice
                if job is None:
                    raise
            else:
                if res.code != 0:
                    raise SlurmError(f"sbatch exited with {res.code}: {res.err.strip()[-500:]}")
                job = parse_job_id(res.out)
        except SlurmError as exc:
            for run in runs:
                outcomes[run.fqid] = SubmitOutcome(run.fqid, None, str(exc))
            return
        ids = [job] if len(runs) == 1 else [f"{job}_{i}" for i in range(len(runs))]
        with open(self.journal, "a", encoding="utf-8") as f:  # key -> job id, for a person looking for a run
            f.write(f"{time.time():.3f} {job} {key} {' '.join(r.key for r in runs)}\n")
        for run, backend_id in zip(runs, ids, strict=True):
            outcomes[run.fqid] = SubmitOutcome(run.fqid, backend_id)

    async def _find(self, conf: str | None, key: str) -> str | None:
        """The job id of an earlier ``sbatch`` with this idempotency key, if Slurm has it."""
        try:
            res = await self._cmd(conf, ["squeue", "-h", "--states=all", "-n", key, "-o", "%F|%k"])
        except SlurmError:
            return None
        for line in res.out.splitlines():
            job, _, comment = line.strip().partition("|")
            if comment == key and job.isdigit():
                return job
        return None

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
                updates.append(StatusUpdate(h.fqid, S.FAILED, reason=f"lost: {bad}", backend_verdict="lost"))
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
                updates += [StatusUpdate(h.fqid, S.FAILED, reason=reason, backend_verdict="lost")
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
            return StatusUpdate(h.fqid, S.KILLED, reason="killed"), None
        log = read_log(h.outputdir)
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
        log = read_log(h.outputdir)
        if log.finished:
            return _by_log(h, log, "the wrapper ended")
        if log.started is not None:
            return StatusUpdate(h.fqid, S.FAILED, reason="Slurm no longer knows the job; its wrapper started but "
                                                         "never ended (killed with its node or its job)")
        if array_listed and ref.task is not None:
            # Pending tasks cancelled one by one leave no record at all, while their siblings are listed.
            return StatusUpdate(h.fqid, S.HELD, reason="the array task left the queue before it started: cancelled "
                                                       "outside the orchestrator", backend_verdict="cancelled")
        return StatusUpdate(h.fqid, S.FAILED, reason="Slurm has no record of the job and it left no log",
                            backend_verdict="lost")

    def _judge_row(self, h: RunHandle, row: Row) -> StatusUpdate | None:
        """The report for a run in ``row``'s Slurm state, or ``None`` when the core knows it already."""
        state = row.state
        if state in QUEUED:
            return None  # submitted (a requeued run never moves back from running)
        if state in ACTIVE:
            return None if h.status == S.RUNNING else StatusUpdate(h.fqid, S.RUNNING)
        if state == "COMPLETED":
            return StatusUpdate(h.fqid, S.COMPLETED, exit_code=0)
        if state == "CANCELLED" and h.backend_id in self._killed:
            return StatusUpdate(h.fqid, S.KILLED, reason="killed")
        if state in ("CANCELLED", "PREEMPTED"):
            what = "cancelled" if state == "CANCELLED" else "preempted"
            return StatusUpdate(h.fqid, S.HELD, reason=f"Slurm: {state} ({what} outside the orchestrator, by an "
                                                       "administrator or the system)", backend_verdict="cancelled")
        log = read_log(h.outputdir)
        code = log.exit_code if log.exit_code is not None else row.exit_code
        if state in FAILED:
            why = "" if log.started is not None else " before the wrapper started (see wrapper.out)"
            return StatusUpdate(h.fqid, S.FAILED, exit_code=code, reason=f"Slurm: {state}{why}")
        if state in ABORTED:
            reason = f"Slurm: {state} ({ABORTED[state]})"
            # The wrapper started: its log tells how far the run got (no END: worker level). Else Slurm's word.
            verdict = None if log.started is not None else "aborted"
            return StatusUpdate(h.fqid, S.FAILED, exit_code=code, reason=reason, backend_verdict=verdict)
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
        groups: dict[str | None, list[tuple[int, JobRef]]] = {}
        for i, h in enumerate(handles):
            try:
                groups.setdefault(self._conf(h.settings), []).append((i, JobRef.parse(h.backend_id)))
            except ValueError as exc:
                results[i] = str(exc)
        for conf, items in groups.items():
            keys = [ref.key for _, ref in items]
            self._killed.update(keys)  # before the call: a tick that sees CANCELLED meanwhile knows it was us
            try:
                res = await self._cmd(conf, ["scancel", *keys])
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
        return StatusUpdate(h.fqid, S.COMPLETED, exit_code=0)
    return StatusUpdate(h.fqid, S.FAILED, exit_code=code, reason=f"{why} with exit code {code}")
