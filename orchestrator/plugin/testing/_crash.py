"""The orchestrator the SIGKILL checks kill: ``python -m orchestrator.plugin.testing._crash SPEC`` (JSON).

It opens the home, adds a job of ``n`` subjobs running ``script`` (``$0`` is the index) on the backend,
submits it and SIGKILLs itself: ``when="running"`` once every subjob runs (and the home has recorded it),
``when="submission"`` as soon
as the backend has answered the submission (before the answer is surely recorded). Public API only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import anyio

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator, RetryPolicy


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


async def main(spec: dict[str, Any]) -> None:
    async with Orchestrator(home=spec["home"], config=spec["config"]) as orch:
        script, n = spec["script"], int(spec["n"])
        j = await orch.jobs.add(Job(name="crash", application=Executable("/bin/sh", args=["-c", script, "-"]),
                                    splitter=ArgSplitter([["-c", script, str(i)] for i in range(n)]),
                                    backend=Backend(spec["backend"], **spec["settings"]),
                                    retry=RetryPolicy(max_early=0, max_late_handled=0, max_late_unhandled=0)))
        if spec["when"] == "submission":
            events = orch.events()

            async def watch() -> None:
                async for ev in events:
                    if type(ev).__name__ == "SubmitOutcomes":
                        _die()

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                await anyio.sleep(0.01)  # subscribed
                await j.submit(keep_going=True)
                await anyio.sleep(30)  # the watcher kills this process first
        await j.submit(keep_going=True)
        with anyio.fail_after(float(spec["timeout"])):
            while not (len(j.subjobs) == n and all(s.status == "running" for s in j.subjobs)):
                await anyio.sleep(0.05)
        # Mid-run as the home records it: the statuses are written every flush_interval (0.2 s by default).
        flush = float(spec["config"].get("core", {}).get("flush_interval", 0.2))
        await anyio.sleep(3 * flush)
        print("running", flush=True)
        _die()


if __name__ == "__main__":
    anyio.run(main, json.loads(sys.argv[1]))
