"""Running a master's postprocessors once every subjob ended (``RunPostprocess``), in a worker thread.

The job's ``postprocessors`` (and the older ``merger``) run in order; the
first error is the master's reason (it is then ``failed``), and subjobs a
checker failed are reported with their reasons. The outcome goes back to
the state machine as ``PostprocessDone``.

A job of another user than the orchestrator's (a multi-user service): every
postprocessor but the notifications runs in a process of its own as the
job's owner (:mod:`.postrun`), never in this one; its result comes back the
same way. That work is not the runtime's long work (its ``work_limit``
slots, which every user's preparing needs): the user's code may never end,
and sixteen mergers that slept for ever took every slot, so no one's job
was split again. Each owner's postprocessing takes one of that owner's own
``work_limit`` slots instead (:class:`~.executor.OwnerSlots`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio

from ..core.events import Event, PostprocessDone
from ..core.instructions import Notify, RunPostprocess
from ..core.machine import StateMachine
from ..core.statuses import JobStatus
from ..plugin.postprocess import Notification, Outcome, PostprocessContext, PostprocessResult, SubjobOutput
from ..plugin.users import Identity, OwnerError, identity
from . import registry
from .definitions import Definitions
from .executor import OwnerSlots
from .postrun import run_as_owner
from .workspace import Workspace


class Postprocessing:
    def __init__(self, *, sm: StateMachine, definitions: Definitions, workspace: Workspace,
                 settings: Mapping[str, Any], post: Callable[[Event], Awaitable[None]], log: Any,
                 owner_slots: OwnerSlots | None = None) -> None:
        self.sm = sm
        self.definitions = definitions
        self.workspace = workspace
        self.settings = settings
        self.post = post
        self.log = log
        self.owner_slots = owner_slots or OwnerSlots(16)

    def owned(self, job: int) -> bool:
        """Whether ``job``'s postprocessing runs as its owner: not the runtime's long work, then (its owner's)."""
        return bool(self.definitions.spec(job).get("owner"))

    def postprocessors(self, job: int) -> list[Any]:
        return [p for _, p in self._described(job)]

    def _described(self, job: int) -> list[tuple[dict[str, Any], Any]]:
        """Each postprocessor with its stored description (what a process as the owner rebuilds it from)."""
        spec = self.definitions.spec(job)
        stored = list(spec.get("postprocessors") or [])
        if spec.get("merger"):
            stored.insert(0, spec["merger"])
        found = [(d, registry.load_postprocessor(d)) for d in stored]
        return [(d, p) for d, p in found if p is not None]

    def context(self, job: int) -> PostprocessContext:
        statuses = self.sm.statuses(job)
        reasons = self.sm.reasons(job, range(len(statuses)))
        subjobs = [SubjobOutput(i, JobStatus.from_code(code), self.workspace.outputdir((job, i)), reasons[i])
                   for i, code in enumerate(statuses)]
        owner = self.definitions.spec(job).get("owner")
        counts = {s.value: n for s, n in self.sm.counts(job).items()}
        return PostprocessContext(str(job), self.definitions.names.get(job, ""), self.workspace.outputdir((job,)),
                                  subjobs, counts, self.settings, self.log, str(owner) if owner else None)

    async def run(self, ins: RunPostprocess) -> None:
        job = ins.job
        context = self.context(job)
        error: str | None = None
        failed: list[tuple[int, str]] = []
        described = self._described(job)
        chosen = [p for _, p in described]
        owner: Identity | None = None
        try:
            owner = identity(self.definitions.spec(job).get("owner"))
        except OwnerError as exc:
            error = f"postprocessors not run: {exc}"
            described = []
        slots = self.owner_slots.of(owner.name) if owner else None
        for data, post in [(d, p) for d, p in described if not isinstance(p, Notification)]:
            try:
                if owner is not None and slots is not None:
                    async with slots:
                        result: PostprocessResult = await run_as_owner(owner, data, context, type(post).__name__)
                else:
                    result = await anyio.to_thread.run_sync(post.run, context)
            except Exception as exc:  # a user's merger or checker: whatever it raises fails the master, saying so
                result = PostprocessResult(f"{type(post).__name__}: {type(exc).__name__}: {exc}")
            if result.error and error is None:
                error = result.error
            failed += result.failed_subjobs
        if error:
            self.log.warning("postprocessing failed", fqid=str(job), reason=error)
        notices = [p for p in chosen if isinstance(p, Notification)]
        await self._tell(job, notices, context, outcome(context, failed, error))
        await self.post(PostprocessDone(stimulus_id=ins.stimulus_id, time=time.time(), job=job, error=error,
                                      failed_subjobs=failed))

    async def notify(self, ins: Notify) -> None:
        """A master became ``held``: its notifications that ask for it are sent now."""
        context = self.context(ins.job)
        notices = [p for p in self.postprocessors(ins.job) if isinstance(p, Notification)]
        await self._tell(ins.job, notices, context, outcome(context, [], None, held=True))

    async def _tell(self, job: int, notices: list[Notification], context: PostprocessContext, end: Outcome) -> None:
        for notice in notices:
            if end.status not in notice.on:
                continue
            try:
                await anyio.to_thread.run_sync(notice.send, context, end)
                self.log.info("notification sent", fqid=str(job), notifier=type(notice).__name__, status=end.status)
            except (OSError, ValueError) as exc:  # never fails the job: said in the log
                self.log.warning("notification failed", fqid=str(job), notifier=type(notice).__name__,
                                 error=f"{type(exc).__name__}: {exc}")


def outcome(context: PostprocessContext, failed: list[tuple[int, str]], error: str | None, *,
            held: bool = False) -> Outcome:
    """The master's ending once its checkers ran: their failures counted, the first reasons gathered."""
    counts = dict(context.counts)
    by_index = {s.index: s for s in context.subjobs}
    checked = {i: why for i, why in failed if i in by_index}  # (a checker is the user's: it may name any index)
    for index in checked:
        if by_index[index].status == JobStatus.COMPLETED:
            counts["completed"] = counts.get("completed", 0) - 1
            counts["failed"] = counts.get("failed", 0) + 1
    counts = {k: n for k, n in counts.items() if n}
    failures = [(f"{context.fqid}.{s.index}", checked.get(s.index) or s.reason or "failed") for s in context.subjobs
                if s.index in checked or s.status == JobStatus.FAILED][:10]
    if held:
        status = "held"
    elif error or counts.get("failed"):  # the master-status rules: failed, then completed, then killed
        status = "failed"
    else:
        status = "completed" if counts.get("completed") else "killed"
    return Outcome(status, counts, failures, error)
