"""User operations: add, submit, kill, resubmit, copy, remove.

Each operation checks its request against the job's status, asks the
drivers (in bulk, natively or emulated), and turns the drivers' answers into
state-machine moves. Operations on one top-level job and its subjobs hold
that job's lock, so two of them never interleave. A refused or failed
operation leaves the repository as it was.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .batches import by_toplevel, collect_targets, gc_paused
from .bulk import Bulk
from .drivers import RunSpec, SettingsError, SubmitOutcome
from .errors import JobError
from .ids import FQID
from .job import Job
from .mergers import Merger
from .model import Backend, Executable, JobInfo
from .partition import validate_partition
from .plugins import driver_class
from .runspec import build_run_spec
from .splitters import Splitter
from .status import FINAL, KILLABLE, RESUBMITTABLE, JobStatus

if TYPE_CHECKING:
    from .engine import Engine

S = JobStatus


class Operations:
    def __init__(self, engine: Engine) -> None:
        self.e = engine
        self.bulk = Bulk(engine.config.core["emulated_bulk_concurrency"])
        self._next_id: int | None = None

    # ------------------------------------------------------------ checks
    def validate(self, job: Job, fqid: str, *, check_backend: bool = True) -> None:
        """Everything ``add()`` can check without running anything."""
        if not isinstance(job.name, str):
            raise JobError("name must be a string", fqid=fqid, field="name")
        if not isinstance(job.application, Executable):
            raise JobError("application must be Executable(...)", fqid=fqid, field="application")
        job.application.validate(fqid)
        for fieldname in ("inputfiles", "outputfiles"):
            values = getattr(job, fieldname)
            if not all(isinstance(v, str) and v for v in values):
                raise JobError("must be a list of non-empty strings", fqid=fqid, field=fieldname)
        for pattern in job.outputfiles:
            if pattern.startswith("/") or ".." in Path(pattern).parts:
                raise JobError(f"{pattern!r} escapes the job's directory", fqid=fqid, field="outputfiles")
        if job.splitter is not None and not isinstance(job.splitter, Splitter):
            raise JobError("splitter must be a Splitter", fqid=fqid, field="splitter")
        if job.merger is not None and not isinstance(job.merger, Merger):
            raise JobError("merger must be a Merger", fqid=fqid, field="merger")
        if job.mode not in ("test", "production"):
            raise JobError(f"mode must be 'test' or 'production', not {job.mode!r}", fqid=fqid, field="mode")
        job.retry.validate(fqid)
        if check_backend:
            job.backend = self.checked_backend(job.backend, fqid)
        if job.steps is not None or job.step_weights is not None or job._prejob or job._aggregator:
            validate_partition(job, fqid, self.validate)

    def checked_backend(self, backend: str | Backend | None, fqid: str) -> Backend:
        backend = Backend.coerce(backend, fqid)
        try:
            cls = driver_class(backend.name)
        except KeyError as exc:
            raise JobError(str(exc.args[0]), fqid=fqid, field="backend") from None
        try:
            settings = cls.validate_settings(backend.settings)
        except SettingsError as exc:
            raise JobError(str(exc), fqid=fqid, field=f"backend.{exc.field}") from None
        return Backend(backend.name, **settings)

    def _run_spec(self, job: Job) -> RunSpec:
        return build_run_spec(job, self.e.workspace, self.e.home_key, self.e.checkpoints.env())

    # --------------------------------------------------------------- add
    async def add(self, job: Job) -> Job:
        if job._engine is not None or job.parent is not None:
            raise JobError("is already registered", fqid=job.fqid_or_new)
        self.validate(job, job.fqid_or_new)
        if self._next_id is None:
            self._next_id = await self.e.repo.next_id()
        job_id = self._next_id
        self._next_id += 1
        job.id, job._engine = job_id, self.e
        job.info = JobInfo(timestamps={"new": time.time()})
        self.e.sm.add_job(job_id)
        self.e.jobs[job_id] = job
        try:
            await self.e.repo.add_job(self.e.row(job))
        except BaseException:
            self.e.jobs.pop(job_id, None)
            self.e.sm.forget(job_id)
            job.id, job._engine = None, None
            raise
        return job

    # ------------------------------------------------------------ submit
    async def submit(self, job: Job, keep_going: bool = False) -> None:
        if job.parent is not None:
            raise JobError("a subjob cannot be submitted on its own (use resubmit())", fqid=job.fqid)
        async with self.e.lock(job):
            if job.status != S.NEW:
                raise JobError(f"cannot submit a job that is {job.status.value} (use resubmit())", fqid=job.fqid)
            if job.splitter is None:
                await self._submit_single(job)
            else:
                await self._submit_master(job, keep_going)

    def _configure_shared(self, job: Job) -> None:
        """The application's shared part, once: copy input files into the input dir."""
        target = job.inputdir
        names: set[str] = set()
        target.mkdir(parents=True, exist_ok=True)
        for f in job.inputfiles:
            src = Path(f).expanduser()
            if not src.is_file():
                raise JobError(f"input file {f!r} does not exist or is not a file", fqid=job.fqid, field="inputfiles")
            if src.name in names:
                raise JobError(f"two input files are named {src.name!r}", fqid=job.fqid, field="inputfiles")
            names.add(src.name)
            shutil.copy2(src, target / src.name)

    async def _submit_single(self, job: Job) -> None:
        before = JobInfo.from_dict(job.info.to_dict())
        try:
            self._configure_shared(job)
        except BaseException:
            self.e.workspace.remove(job.fqid_tuple)
            raise
        self.e.move([job.fqid_tuple], S.SUBMITTING)
        failures = await self._submit_runs([job], keep_going=False, on_reject=lambda j: S.NEW)
        if failures:
            job.info = before
            self.e.workspace.remove(job.fqid_tuple)
            self.e.mark_dirty(job)
            await self.e.flush()
            raise JobError(f"submission failed: {failures[0][1]}", fqid=job.fqid)
        await self.e.flush()

    def _split(self, master: Job) -> list[Job]:
        assert master.splitter is not None
        templates = master.splitter.split(master)
        if not templates:
            raise JobError("the splitter made no subjobs", fqid=master.fqid, field="splitter")
        now = time.time()
        for i, sub in enumerate(templates):
            where = f"{master.fqid}.{i}"
            if not isinstance(sub.application, type(master.application)):
                raise JobError("the splitter changed the application's type", fqid=where, field="application")
            if sub.backend.name != master.backend.name:
                raise JobError("the splitter changed the backend's type", fqid=where, field="backend")
            # The master's backend settings were checked at add(); only a splitter's changes need a look.
            self.validate(sub, where, check_backend=sub.backend.settings != master.backend.settings)
            sub.id, sub.parent, sub._engine = i, master, self.e
            sub.info = JobInfo(timestamps={"new": now})
        return templates

    async def _submit_master(self, master: Job, keep_going: bool) -> None:
        with gc_paused():
            await self._submit_master_now(master, keep_going)

    async def _submit_master_now(self, master: Job, keep_going: bool) -> None:
        e = self.e
        mid = master.fqid_tuple[0]
        before = JobInfo.from_dict(master.info.to_dict())
        now = time.time()
        e.apply(e.sm.pin(mid, S.SUBMITTING, now))
        stored = False
        try:
            subjobs = self._split(master)
            self._configure_shared(master)
            e.sm.split(mid, len(subjobs))
            master.subjobs._built = dict(enumerate(subjobs))
            if master._prejob is None:  # stored as submitting: the write-ahead record of this submission
                if master._aggregator is not None:
                    master.info.partition["phase"] = "subjobs"
                e.move([s.fqid_tuple for s in subjobs], S.SUBMITTING)
            await e.repo.add_subjobs(e.row(master), [e.row(s) for s in subjobs])
            stored = True
        except BaseException as exc:
            await self._unsplit(master, before, stored=stored)
            if isinstance(exc, JobError):
                raise
            if isinstance(exc, Exception):
                raise JobError(f"could not split or configure: {type(exc).__name__}: {exc}", fqid=master.fqid) from exc
            raise
        if master._prejob is not None:  # the subjobs wait, new, for the pre-job to complete
            try:
                await e.partitions.start_prejob(master)
            except BaseException as exc:
                await self._unsplit(master, before, stored=True)
                if isinstance(exc, JobError):
                    raise JobError(f"the prejob could not be submitted: {exc}", fqid=master.fqid) from exc
                raise
            await e.flush()
            return
        failures = await self._submit_runs(subjobs, keep_going=keep_going, on_reject=None)
        if all(s.status == S.NEW for s in subjobs):
            await self._unsplit(master, before, stored=True)
            raise JobError(f"no subjob could be submitted; first error: {failures[0][1] if failures else '?'}",
                           fqid=master.fqid)
        e.apply(e.sm.pin(mid, None, time.time()))
        await e.flush()
        if failures and not keep_going:
            first = failures[0]
            raise JobError(f"{len(failures)} subjob(s) failed to submit; first, {first[0]}: {first[1]}",
                           fqid=master.fqid)

    async def _unsplit(self, master: Job, before: JobInfo, *, stored: bool) -> None:
        """Put a master back exactly as it was before ``submit()``."""
        e = self.e
        mid = master.fqid_tuple[0]
        e.forget(sub.fqid_tuple for sub in master.subjobs._built.values())
        master.subjobs._built = {}
        e.sm.unsplit(mid)
        master.info = before
        e.workspace.remove(master.fqid_tuple)
        e.notify()
        if stored:
            await e.repo.remove_subjobs(e.row(master))
        e.mark_dirty(master)
        await e.flush()

    async def _submit_runs(self, jobs: Sequence[Job], keep_going: bool,
                           on_reject: Callable[[Job], JobStatus] | None) -> list[tuple[str, str]]:
        """Send ``jobs`` (already ``submitting``) to their backends; move them by the answers.

        A run the backend refused goes to ``on_reject``, or, when that is
        ``None``, to ``failed`` under native bulk and ``new`` under emulated
        bulk (DESIGN.md). Runs never attempted go back to ``new``.
        """
        e = self.e
        # Write-ahead: each run is on disk as submitting, with the attempt counter that makes its key,
        # before any backend hears of it; after a crash the key finds it again (reconcile.py).
        await e.flush()
        failures: list[tuple[str, str]] = []
        groups: dict[str, list[Job]] = {}
        for job in jobs:
            groups.setdefault(job.backend.name, []).append(job)
        for name, group in groups.items():
            driver = await e.driver(name)
            previous = {j.fqid: e.handle_of(j) for j in group if j.backend_id is not None}
            for j in group:
                j.backend_id = None
            prepared, unready = await e.checkpoints.prepare(group)  # the state each run starts from, in its work dir
            if unready:  # its starting state could not be written: that run is refused, not started without it
                ready = [j for j in group if j.fqid_tuple not in unready]
                got, native = (await self.bulk.submit(driver, [self._run_spec(j) for j in ready], keep_going, previous)
                               if ready else ([], False))
                answers = dict(zip([j.fqid_tuple for j in ready], got, strict=True))
                outcomes = [answers[j.fqid_tuple] if j.fqid_tuple in answers
                            else SubmitOutcome(j.fqid, None, unready[j.fqid_tuple]) for j in group]
            else:
                outcomes, native = await self.bulk.submit(driver, [self._run_spec(j) for j in group], keep_going,
                                                          previous)
            ok: list[FQID] = []
            back_new: list[FQID] = []
            rejected: list[FQID] = []
            for job, outcome in zip(group, outcomes, strict=True):
                if outcome is None:
                    back_new.append(job.fqid_tuple)
                elif outcome.ok:
                    job.backend_id = outcome.backend_id
                    ok.append(job.fqid_tuple)
                else:
                    reason = outcome.error or "submission refused"
                    failures.append((job.fqid, reason))
                    job.info.reason = f"submission failed: {reason}"
                    target = on_reject(job) if on_reject else (S.FAILED if native else S.NEW)
                    (rejected if target == S.FAILED else back_new).append(job.fqid_tuple)
            e.checkpoints.commit(prepared, set(ok))
            e.move(ok, S.SUBMITTED)
            e.move(back_new, S.NEW)
            e.move(rejected, S.FAILED)
            if failures and not keep_going:
                rest = [j.fqid_tuple for g in list(groups.values())[list(groups).index(name) + 1:] for j in g]
                e.move(rest, S.NEW)
                break
        return failures

    # -------------------------------------------------------------- kill
    def _kill_targets(self, job: Job) -> list[Job]:
        status = job.status
        if len(job.fqid_tuple) == 1 and self.e.sm.is_master(job.fqid_tuple[0]):
            mid = job.fqid_tuple[0]
            indexes = self.e.sm.subjob_ids(mid, KILLABLE)
            return self.e.materialize(job, indexes) + self.e.partitions.active_linked(job)
        if status == S.NEW:
            raise JobError("cannot kill a job that was never submitted", fqid=job.fqid)
        if status in FINAL:
            return []
        if status not in KILLABLE:
            raise JobError(f"cannot kill a job that is {status.value}", fqid=job.fqid)
        return [job]

    async def kill(self, jobs: Sequence[Job], keep_going: bool = False) -> None:
        errors: list[str] = []
        for top, members in by_toplevel(jobs):
            async with self.e.lock(top):
                targets, refused = collect_targets(members, self._kill_targets, keep_going)
                errors += refused
                errors += await self._kill_runs(targets, keep_going)
                await self.e.flush()
            if errors and not keep_going:
                break
        if errors and not keep_going:
            raise JobError(f"kill stopped: {errors[0]}")

    async def _kill_runs(self, targets: Sequence[Job], keep_going: bool) -> list[str]:
        e = self.e
        errors: list[str] = []
        groups: dict[str, list[Job]] = {}
        for job in targets:
            if job.backend_id is not None:
                groups.setdefault(job.backend.name, []).append(job)
            else:
                errors.append(f"{job.fqid}: no backend id to kill")
        for name, group in groups.items():
            driver = await e.driver(name)
            results = await self.bulk.kill(driver, [e.handle_of(j) for j in group], keep_going)
            killed = [j.fqid_tuple for j, r in zip(group, results, strict=True) if r is None]
            errors += [f"{j.fqid}: {r}" for j, r in zip(group, results, strict=True) if isinstance(r, str)]
            e.move(killed, S.KILLED)  # a run that ended meanwhile is refused: it keeps its ending
            if errors and not keep_going:
                break
        return errors

    # ----------------------------------------------------------- resubmit
    def _resubmit_targets(self, job: Job, only_failed: bool) -> list[Job]:
        fq = job.fqid_tuple
        if len(fq) == 1 and self.e.sm.is_master(fq[0]):
            self.e.partitions.check_resubmit(job)
            wanted = {S.FAILED, S.NEW} | (set() if only_failed else {S.KILLED})
            indexes = self.e.sm.subjob_ids(fq[0], wanted)
            return self.e.materialize(job, indexes)
        status = job.status
        if status == S.NEW and len(fq) == 1:
            raise JobError("was never submitted (use submit())", fqid=job.fqid)
        if status == S.HELD:
            raise JobError("is held (use release())", fqid=job.fqid)
        if status not in RESUBMITTABLE:
            raise JobError(f"cannot resubmit a job that is {status.value}", fqid=job.fqid)
        return [job]

    async def resubmit_job(self, job: Job, only_failed: bool = True, backend: str | Backend | None = None,
                           keep_going: bool = False, from_state: str | None = None) -> None:
        if from_state is not None:
            fq = job.fqid_tuple
            if len(fq) == 1 and self.e.sm.is_master(fq[0]):
                raise JobError("a state belongs to one run: resubmit one subjob (ID.i) from it", fqid=job.fqid,
                               field="from_state")
            self.e.checkpoints.adopt(job, from_state)
        try:
            await self._resubmit([job], only_failed=only_failed, backend=backend, keep_going=keep_going,
                                 fresh=from_state is None)
        finally:
            self.e.checkpoints.discard([job])

    async def resubmit(self, jobs: Sequence[Job], keep_going: bool = False,
                       backend: str | Backend | None = None) -> None:
        await self._resubmit(jobs, only_failed=True, backend=backend, keep_going=keep_going)

    async def _resubmit(self, jobs: Sequence[Job], *, only_failed: bool, backend: str | Backend | None,
                        keep_going: bool, fresh: bool = True) -> None:
        errors: list[str] = []
        for top, members in by_toplevel(jobs):
            async with self.e.lock(top):
                targets, refused = collect_targets(
                    members, lambda j: self._resubmit_targets(j, only_failed), keep_going)
                errors += refused
                if backend is not None:
                    self._change_backend(top, targets, backend)
                if fresh:  # a user's resubmission starts from the initial state; --from-state from its own
                    self.e.checkpoints.mark_fresh(targets)
                try:
                    errors += await self._resubmit_runs(targets, keep_going)
                finally:
                    self.e.checkpoints.discard(targets)
                await self.e.flush()
            if errors and not keep_going:
                break
        if errors and not keep_going:
            raise JobError(f"resubmit stopped: {errors[0]}")

    def _change_backend(self, top: Job, targets: Sequence[Job], backend: str | Backend) -> None:
        new = self.checked_backend(backend, top.fqid)
        if new.name != top.backend.name:
            raise JobError(f"resubmit may change the backend's settings, not its type ({top.backend.name} "
                           f"-> {new.name})", fqid=top.fqid, field="backend")
        for job in {id(j): j for j in [top, *targets]}.values():
            job.backend = new.copy()
            self.e.mark_dirty(job, spec=True)

    async def _resubmit_runs(self, targets: Sequence[Job], keep_going: bool) -> list[str]:
        if not targets:
            return []
        was_new = {j.fqid_tuple for j in targets if j.status == S.NEW}
        for job in targets:
            job.info.reason = None
        self.e.move([j.fqid_tuple for j in targets], S.SUBMITTING)
        # A subjob left unsubmitted stays "new"; one that had run before is "failed", with the reason.
        failures = await self._submit_runs(targets, keep_going=keep_going,
                                           on_reject=lambda j: S.NEW if j.fqid_tuple in was_new else S.FAILED)
        return [f"{f}: {r}" for f, r in failures]

    async def submit_prepared(self, fqids: Sequence[FQID]) -> None:
        """Send jobs the engine already moved to ``submitting`` (automatic retries)."""
        jobs = [self.e.lookup(fq) for fq in fqids]
        for top, members in by_toplevel(jobs):
            async with self.e.lock(top):
                ready = [j for j in members if j.status == S.SUBMITTING]
                await self._submit_runs(ready, keep_going=True, on_reject=lambda j: S.FAILED)
                await self.e.flush()

    async def release(self, job: Job, retry_args: Sequence[str] | None = None) -> None:
        """Resume a held job (or a master's held subjobs), optionally with new retry arguments."""
        async with self.e.lock(job):
            fq = job.fqid_tuple
            if len(fq) == 1 and self.e.sm.is_master(fq[0]):
                indexes = self.e.sm.subjob_ids(fq[0], [S.HELD])
                targets = self.e.materialize(job, indexes)
            elif job.status == S.HELD:
                targets = [job]
            else:
                raise JobError(f"cannot release a job that is {job.status.value} (only held jobs)", fqid=job.fqid)
            if not targets:
                raise JobError("has no held subjobs to release", fqid=job.fqid)
            for t in targets:
                if retry_args is not None:
                    t.info.retry_args = [str(a) for a in retry_args]
                t.info.reason = None
            self.e.move([t.fqid_tuple for t in targets], S.SUBMITTING)
            failures = await self._submit_runs(targets, keep_going=True, on_reject=lambda j: S.FAILED)
            await self.e.flush()
        if failures:
            raise JobError(f"release: {len(failures)} submission(s) failed; first, {failures[0][0]}: {failures[0][1]}",
                           fqid=job.fqid)

    # --------------------------------------------------------- copy, remove
    async def copy(self, job: Job) -> Job:
        twin = job.template()
        if job.parent is None:
            twin.splitter, twin.merger = job.splitter, job.merger
            twin.step_weights = list(job.step_weights) if job.step_weights is not None else None
            twin.prejob = job._prejob.template() if job._prejob is not None else None
            twin.aggregator = job._aggregator.template() if job._aggregator is not None else None
            twin.min_success = job.min_success
        return await self.add(twin)

    async def remove(self, job: Job) -> None:
        if job.parent is not None:
            raise JobError("a subjob cannot be removed on its own (remove its master)", fqid=job.fqid)
        async with self.e.lock(job):
            if self.e.is_active(job, include_postprocess=True) or job.status not in FINAL | {S.NEW}:
                raise JobError(f"cannot remove a job that is {job.status.value} (kill it first)", fqid=job.fqid)
            job_id = job.fqid_tuple[0]
            await self.e.repo.remove_job(job_id)
            self.e.workspace.remove(job.fqid_tuple)
            self.e.sm.forget(job_id)
            self.e.jobs.pop(job_id, None)
            self.e.partitions.forget(job_id)
            self.e.forget([job.fqid_tuple, *(s.fqid_tuple for s in job.subjobs._built.values())])
            job._engine = None
        self.e.notify()
