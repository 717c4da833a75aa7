"""Running a master's postprocessors once every subjob ended (``RunPostprocess``), in a worker thread.

The job's ``postprocessors`` (and the older ``merger``) run in order; the
first error is the master's reason (it is then ``failed``), and subjobs a
checker failed are reported with their reasons. The outcome goes back to
the state machine as ``PostprocessDone``.
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
from ..plugin.postprocess import PostprocessContext, PostprocessResult, SubjobOutput
from . import registry
from .definitions import Definitions
from .workspace import Workspace


class Postprocessing:
    def __init__(self, *, sm: StateMachine, definitions: Definitions, workspace: Workspace,
                 settings: Mapping[str, Any], post: Callable[[Event], Awaitable[None]], log: Any) -> None:
        self.sm = sm
        self.definitions = definitions
        self.workspace = workspace
        self.settings = settings
        self.post = post
        self.log = log

    def postprocessors(self, job: int) -> list[Any]:
        spec = self.definitions.spec(job)
        found = [registry.load_postprocessor(d) for d in spec.get("postprocessors") or []]
        if spec.get("merger"):
            found.insert(0, registry.load_postprocessor(spec["merger"]))
        return [p for p in found if p is not None]

    async def run(self, ins: RunPostprocess) -> None:
        job = ins.job
        js = self.sm.job_state(job)
        statuses = bytes(js.runs.status)
        subjobs = [SubjobOutput(i, JobStatus.from_code(code), self.workspace.outputdir((job, i)),
                                js.runs.extras[i].reason if i in js.runs.extras else None)
                   for i, code in enumerate(statuses)]
        context = PostprocessContext(str(job), self.definitions.names.get(job, ""),
                                     self.workspace.outputdir((job,)), subjobs,
                                     {s.value: n for s, n in js.counts().items()}, self.settings, self.log)
        error: str | None = None
        failed: list[tuple[int, str]] = []
        for post in self.postprocessors(job):
            try:
                result: PostprocessResult = await anyio.to_thread.run_sync(post.run, context)
            except OSError as exc:
                result = PostprocessResult(f"{type(post).__name__}: {exc}")
            if result.error and error is None:
                error = result.error
            failed += result.failed_subjobs
        if error:
            self.log.warning("postprocessing failed", fqid=str(job), reason=error)
        await self.post(PostprocessDone(stimulus_id=ins.stimulus_id, time=time.time(), job=job, error=error,
                                      failed_subjobs=failed))

    async def notify(self, ins: Notify) -> None:
        """Notifiers are postprocessors of their own; nothing else is told here yet."""
