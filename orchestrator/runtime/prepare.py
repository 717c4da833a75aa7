"""Storing new jobs, preparing them to run, and undoing it: splitting, configuring shared inputs, storing
subjobs; linked jobs.

``Prepare``: the splitter (pure, in a worker thread) makes one delta per
subjob; each is checked; the shared inputs are copied into the master's
input dir once; the subjobs are stored in one transaction, already
``submitting`` with attempt 1 when the state machine said so (the
write-ahead record of the submission that follows). Any error removes what
was made and answers ``PrepareFailed`` naming the field: the master stays
``new`` with no subjobs and nothing of the attempt is left.

``Unprepare`` removes a split (and the workspace) again after a submission
that left nothing submitted. ``CreateLinked`` adds a pre-job or an
aggregator as a top-level job of its own.
"""

from __future__ import annotations

import json
import shutil
import time
from array import array
from collections.abc import Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import anyio

from ..core.errors import JobError
from ..core.events import Event, LinkedAdded, Prepared, PrepareFailed
from ..core.ids import fqid_str
from ..core.instructions import CreateLinked, Prepare, Unprepare
from ..core.machine import StateMachine
from ..core.splitters import Master, apply_delta, check_path
from ..core.statuses import JobStatus
from ..plugin.users import Identity, OwnerError, copy_as, identity, readable_by
from ..plugin.wrapper import own_dir
from . import gcpause, registry
from .definitions import Definitions
from .executor import OwnerSlots
from .repository import TIME_KINDS, Repository, RunsRow, TopRow
from .workspace import Workspace
from .writer import top_row


class Preparer:
    """Stores new jobs, prepares them to run and undoes it; see the module docstring."""

    def __init__(self, *, definitions: Definitions, repo: Repository, workspace: Workspace,
                 post: Callable[[Event], Awaitable[None]], sm: StateMachine, free_slots: Callable[[str], int],
                 check_subjob: Callable[[Mapping[str, Any], str, Collection[str]], None],
                 owner_slots: OwnerSlots | None = None) -> None:
        self.definitions = definitions
        self.owner_slots = owner_slots or OwnerSlots(16)
        self.repo = repo
        self.workspace = workspace
        self.post = post
        self.sm = sm
        self.free_slots = free_slots
        self.check_subjob = check_subjob
        #: Set by a service: raises a JobError when ``job``'s ``n`` runs may not become active (its quotas); nothing
        #: is stored then.
        self.admission: Callable[[int, Mapping[str, Any], int], None] | None = None
        #: The id the next new top-level job gets (read from the repository when the home opens, or on first need).
        self.next_job: int | None = None

    def admit(self, job: int, spec: Mapping[str, Any], n: int) -> None:
        if self.admission is not None:
            self.admission(job, spec, n)

    # ------------------------------------------------------------ new jobs
    async def store(self, name: str, spec: dict[str, Any], link: tuple[int, str] | None) -> tuple[int, float]:
        """Store a new top-level job (``link``: the master and role of a pre-job or an aggregator) and make its
        definition known; its id and the one time of its creation, stored and told to the state machine."""
        if self.next_job is None:
            self.next_job = await self.repo.next_id()
        job = self.next_job
        self.next_job += 1
        now = time.time()
        info: dict[str, Any] = {"top": {"timestamps": {"new": now}}, "attempt": 0, "run": {}}
        if link is not None:
            info["link"] = list(link)
        runs = RunsRow(job, bytes([JobStatus.NEW.code]), bytes(4), {k: bytes(8) for k in TIME_KINDS})
        await self.repo.add_job(TopRow(job, name, JobStatus.NEW.value, spec, None, info, 0, now), runs)
        self.definitions.add(job, name, spec)
        return job, now

    # ------------------------------------------------------------ prepare
    async def prepare(self, ins: Prepare) -> None:
        job = ins.job
        fq = (job,)
        now = time.time()
        try:
            spec = self.definitions.spec(job)
            owner = identity_of(spec, job) if spec.get("owner") is not None else None
            if owner is not None:  # on the owner's own slots (:meth:`OwnerSlots.of`): their files may keep it long
                async with self.owner_slots.of(owner.name):
                    await self._configure_shared(job, spec, owner)
            else:
                await self._configure_shared(job, spec, None)
            if spec.get("splitter") is None:
                self.admit(job, spec, 1)
                await self.post(Prepared(stimulus_id=ins.stimulus_id, time=now, job=job, n_subjobs=0))
                return
            with gcpause.paused():  # a million deltas, alive until stored: nothing for the collector to find
                deltas = await anyio.to_thread.run_sync(self._split, job, spec)
                n = len(deltas)
                self.admit(job, spec, n)
                code = (JobStatus.SUBMITTING if ins.submitting else JobStatus.NEW).code
                zeros = bytes(8 * n)
                times = {"submitting": (array("d", [now]) * n).tobytes() if ins.submitting else zeros,
                         "submitted": zeros, "running": zeros, "final": zeros}
                attempts = (array("I", [1 if ins.submitting else 0]) * n).tobytes()
                runs = RunsRow(job, bytes([code]) * n, attempts, times)
                row = top_row(self.sm, job, self.definitions, with_spec=False)
                row.n_subjobs = n
                dumps = json.JSONEncoder(separators=(",", ":")).encode  # one encoder for a million deltas
                with anyio.CancelScope(shield=True):  # stored whole, or not at all
                    await self.repo.store_split(row, runs, (dumps(d) if d else None for d in deltas))
                del deltas
            self.definitions.defer_splitter(job)  # its parameters are stored: read again only if asked for
        except BaseException as exc:
            self.workspace.remove(fq)
            error = exc if isinstance(exc, JobError) else JobError(
                f"could not split or configure: {type(exc).__name__}: {exc}", fqid=fqid_str(fq))
            if isinstance(exc, Exception):
                await self.post(PrepareFailed(stimulus_id=ins.stimulus_id, time=time.time(), job=job, error=error))
                return
            raise
        await self.post(Prepared(stimulus_id=ins.stimulus_id, time=now, job=job, n_subjobs=n))

    def _split(self, job: int, spec: dict[str, Any]) -> list[dict[str, Any]]:
        """The subjobs' deltas, each checked (runs in a worker thread: a split may be large)."""
        fqid = str(job)
        splitter = registry.load_splitter(self.definitions.splitter(job))
        assert splitter is not None
        master = Master(fqid, spec, self.free_slots(spec["backend"]["name"]), self.definitions.names.get(job, ""))
        deltas = [d if type(d) is dict else dict(d) for d in splitter.split(master)]
        if not deltas:
            raise JobError("the splitter made no subjobs", fqid=fqid, field="splitter")
        checked_paths: set[str] = set()
        for i, delta in enumerate(deltas):
            where = f"{fqid}.{i}"
            for path in delta:
                if path not in checked_paths:
                    check_path(path, where)
                    checked_paths.add(path)
            if delta:
                self.check_subjob(apply_delta(spec, delta) if len(delta) > 1 or "application.args" not in delta
                                  else {**spec, "application": {**spec["application"],
                                                                "args": delta["application.args"]}},
                                  where, delta.keys())
        return deltas

    async def _configure_shared(self, job: int, spec: Mapping[str, Any], owner: Identity | None) -> None:
        """The application's shared part, once: the input files, copied into the job's input dir.

        A job of another user than the orchestrator's (a multi-user service): its directory and input dir are
        the owner's (mode 0700), and each input file is read and copied as the owner, so that a file the
        owner may not read is refused, naming ``inputfiles``, and the copies are theirs: by short processes,
        waited for on the event loop (a worker thread each, a thousand files a job, held every user's)."""
        target = self.workspace.inputdir((job,))
        names: set[str] = set()
        target.mkdir(parents=True, exist_ok=True)
        if owner is not None:
            own_dir(target.parent, owner)
            own_dir(target, owner)
        for f in spec.get("inputfiles", ()):
            src = Path(f).expanduser()
            if owner is not None:
                why = await readable_by(owner, src)
                if why is not None:
                    raise JobError(f"input file {f!r} cannot be read by its owner {owner.name}: {why}",
                                   fqid=str(job), field="inputfiles")
            if not src.is_file():
                raise JobError(f"input file {f!r} does not exist or is not a file", fqid=str(job), field="inputfiles")
            if src.name in names:
                raise JobError(f"two input files are named {src.name!r}", fqid=str(job), field="inputfiles")
            names.add(src.name)
            if owner is None:
                shutil.copy2(src, target / src.name)
                continue
            try:
                await copy_as(owner, src, target / src.name)
            except OSError as exc:
                raise JobError(f"input file {f!r} could not be copied as its owner {owner.name}: {exc}",
                               fqid=str(job), field="inputfiles") from None

    # ------------------------------------------------------------ undo
    async def unprepare(self, ins: Unprepare) -> None:
        job = ins.job
        if not self.sm.is_master(job):  # the state machine undid the split: the stored one goes too
            runs = RunsRow(job, bytes([JobStatus.NEW.code]), bytes(4), {k: bytes(8) for k in TIME_KINDS})
            row = top_row(self.sm, job, self.definitions, with_spec=False)
            with anyio.CancelScope(shield=True):
                await self.repo.remove_split(row, runs)
        self.workspace.remove((job,))

    # ------------------------------------------------------------ linked jobs
    async def create_linked(self, ins: CreateLinked) -> None:
        master = self.definitions.spec(ins.master)
        template = master.get(ins.role)
        if template is None:
            return
        if ins.reuse is not None and ins.reuse in self.definitions.specs:
            job = ins.reuse
            self.definitions.specs[job]["steps"] = list(ins.steps or ())
            self.definitions.dirty.add(job)
        else:
            spec = dict(template["spec"])
            if ins.steps is not None:
                spec["steps"] = list(ins.steps)
            if ins.role == "aggregator":
                spec["aggregates"] = True  # its steps are its subjobs' final states, exported to it by label
            if "owner" in master:  # a pre-job and an aggregator belong to their master's owner
                spec["owner"] = master["owner"]
            name = template.get("name") or f"{self.definitions.names.get(ins.master) or 'job'}-{ins.role}"
            job, _ = await self.store(name, spec, (ins.master, ins.role))
        await self.post(LinkedAdded(stimulus_id=ins.stimulus_id, time=time.time(), job=job, master=ins.master,
                                    role=ins.role, profile=self.definitions.profile(job)))


def identity_of(spec: Mapping[str, Any], job: int) -> Identity | None:
    """The ids of the job's owner when they are not the orchestrator's own (:func:`identity`)."""
    try:
        return identity(spec.get("owner"))
    except OwnerError as exc:
        raise JobError(str(exc), fqid=str(job), field="owner") from None
