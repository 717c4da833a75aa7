"""Running a master's postprocessors once every subjob ended (``RunPostprocess``), in a worker thread.

The job's ``postprocessors`` (and the older ``merger``) run in order; the
first error is the master's reason (it is then ``failed``), and subjobs a
checker failed are reported with their reasons. The outcome goes back to
the state machine as ``PostprocessDone``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import anyio

from ..core.events import PostprocessDone
from ..core.instructions import Notify, RunPostprocess
from ..core.statuses import JobStatus
from ..plugin.postprocess import PostprocessContext, PostprocessResult, SubjobOutput
from . import registry

if TYPE_CHECKING:
    from .runtime import Runtime


class Postprocessing:
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    def postprocessors(self, job: int) -> list[Any]:
        spec = self.rt.definitions.spec(job)
        found = [registry.load_postprocessor(d) for d in spec.get("postprocessors") or []]
        if spec.get("merger"):
            found.insert(0, registry.load_postprocessor(spec["merger"]))
        return [p for p in found if p is not None]

    async def run(self, ins: RunPostprocess) -> None:
        rt = self.rt
        job = ins.job
        js = rt.sm.job_state(job)
        statuses = bytes(js.runs.status)
        subjobs = [SubjobOutput(i, JobStatus.from_code(code), rt.workspace.outputdir((job, i)),
                                js.runs.extras[i].reason if i in js.runs.extras else None)
                   for i, code in enumerate(statuses)]
        context = PostprocessContext(str(job), rt.definitions.names.get(job, ""), rt.workspace.outputdir((job,)),
                                     subjobs, {s.value: n for s, n in js.counts().items()},
                                     rt.config.section("postprocess"), rt.log)
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
            rt.log.warning("postprocessing failed", fqid=str(job), reason=error)
        await rt.post(PostprocessDone(stimulus_id=ins.stimulus_id, time=time.time(), job=job, error=error,
                                      failed_subjobs=failed))

    async def notify(self, ins: Notify) -> None:
        """Notifiers are postprocessors of their own; nothing else is told here yet."""
