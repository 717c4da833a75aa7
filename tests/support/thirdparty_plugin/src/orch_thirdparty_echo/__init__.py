"""``thirdparty``: an example backend shipped as a separate distribution.

It shows what a plugin author outside this repository writes: a
:class:`orchestrator.Driver` subclass using only names exported by
``orchestrator``, registered under the entry-point group
``orchestrator.backends`` in its own ``pyproject.toml``.

Each run is the job's executable with its arguments, started directly as a
subprocess of the orchestrator (no job wrapper) in a new session, in the
run's work directory, with its stdout and stderr written to
``outputdir/stdout`` and ``outputdir/stderr``. Input files are copied into
the work directory first; output files matching ``outputfiles`` are copied
to the output directory once the run ended. The exit code decides the
outcome: 0 is ``completed``, anything else ``failed``.

Setting: ``greeting`` (a string, default ``"hello"``), exported to the run
as ``$GREETING``. Any other setting is refused.

The driver declares no native ability (:class:`Capabilities` all False), so
the core emulates bulk submit, bulk kill and bulk status over the
single-run :meth:`submit`, :meth:`kill` and :meth:`status`.

Runs live in the orchestrator's process: closing the orchestrator stops
them, and a reopened orchestrator reports runs it no longer knows as
``failed``.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process

from orchestrator.plugin import (
    Capabilities,
    Driver,
    DriverContext,
    JobStatus,
    RunHandle,
    RunSpec,
    SettingsError,
    StatusUpdate,
    SubmitError,
)

__all__ = ["EchoDriver"]

DEFAULT_GREETING = "hello"
#: Seconds between SIGTERM and SIGKILL when a run is killed.
KILL_GRACE = 2.0


@dataclass
class _Run:
    process: Process
    workdir: Path
    outputdir: Path
    outputfiles: tuple[str, ...]
    #: Set once the process was reaped and its outputs collected.
    returncode: int | None = None
    killed: bool = False


class EchoDriver(Driver):
    name = "thirdparty"
    capabilities = Capabilities()  # nothing native: the core emulates every bulk form

    def __init__(self, context: DriverContext) -> None:
        super().__init__(context)
        self._runs: dict[str, _Run] = {}
        # submit() hands each new process to serve(), which reaps it.
        self._send, self._receive = anyio.create_memory_object_stream[str](math.inf)

    # ------------------------------------------------------------ settings
    @classmethod
    def validate_settings(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        for key in settings:
            if key != "greeting":
                raise SettingsError(key, f"backend {cls.name!r} takes no setting {key!r} (it takes 'greeting')")
        greeting = settings.get("greeting", DEFAULT_GREETING)
        if not isinstance(greeting, str):
            raise SettingsError("greeting", f"greeting must be a string, not {greeting!r}")
        return {"greeting": greeting}

    # -------------------------------------------------------------- submit
    async def submit(self, run: RunSpec) -> str:
        exe = run.executable
        path = exe if os.sep in exe else shutil.which(exe, path=run.env.get("PATH", os.environ.get("PATH")))
        if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
            raise SubmitError(f"thirdparty: executable {exe!r} not found or not executable")
        try:
            run.workdir.mkdir(parents=True, exist_ok=True)
            run.outputdir.mkdir(parents=True, exist_ok=True)
            for src in run.inputs:
                shutil.copy2(src, run.workdir / src.name)
        except OSError as exc:
            raise SubmitError(f"thirdparty: cannot prepare {run.workdir}: {exc}") from exc
        env = {
            **os.environ,
            **run.env,
            "GREETING": str(run.settings.get("greeting", DEFAULT_GREETING)),
            "ORCH_MODE": run.mode,
            "ORCH_RETRY_COUNT": str(run.retry_count),
        }
        with open(run.outputdir / "stdout", "wb") as out, open(run.outputdir / "stderr", "wb") as err:
            try:
                process = await anyio.open_process(
                    [path, *run.args], stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                    cwd=run.workdir, env=env, start_new_session=True,
                )
            except OSError as exc:
                raise SubmitError(f"thirdparty: cannot start {exe!r}: {exc}") from exc
        backend_id = f"thirdparty:{process.pid}:{run.key}"
        self._runs[backend_id] = _Run(process, run.workdir, run.outputdir, tuple(run.outputfiles))
        self._send.send_nowait(backend_id)
        self.context.log.debug("started", fqid=run.fqid, pid=process.pid, backend_id=backend_id)
        return backend_id

    async def serve(self) -> None:
        async with anyio.create_task_group() as tg, self._receive:
            async for backend_id in self._receive:
                tg.start_soon(self._reap, backend_id)

    async def _reap(self, backend_id: str) -> None:
        run = self._runs[backend_id]
        code = await run.process.wait()
        for pattern in run.outputfiles:
            for found in run.workdir.glob(pattern):
                if found.is_file():
                    shutil.copy2(found, run.outputdir / found.name)
        await run.process.aclose()
        run.returncode = code

    # ---------------------------------------------------------------- kill
    @staticmethod
    def _signal(run: _Run, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.process.pid, sig)  # its own session: the whole process group

    async def kill(self, handle: RunHandle) -> None:
        run = self._runs.get(handle.backend_id)
        if run is None or run.process.returncode is not None:
            return  # not running here (any more): nothing to stop
        run.killed = True
        self._signal(run, signal.SIGTERM)
        with anyio.move_on_after(KILL_GRACE):
            await run.process.wait()
            return
        self._signal(run, signal.SIGKILL)
        await run.process.wait()

    # -------------------------------------------------------------- status
    async def status(self, handle: RunHandle) -> StatusUpdate | None:
        await anyio.lowlevel.checkpoint()
        run = self._runs.get(handle.backend_id)
        if run is None:
            return StatusUpdate(handle.fqid, JobStatus.FAILED,
                                reason="thirdparty: run unknown to this orchestrator process (was it restarted?)")
        code = run.returncode
        if code is None:
            return StatusUpdate(handle.fqid, JobStatus.RUNNING) if handle.status == JobStatus.SUBMITTED else None
        if run.killed:
            update = StatusUpdate(handle.fqid, JobStatus.KILLED, exit_code=code, reason="thirdparty: killed")
        elif code == 0:
            update = StatusUpdate(handle.fqid, JobStatus.COMPLETED, exit_code=0)
        else:
            reason = f"thirdparty: exit code {code}" if code > 0 else f"thirdparty: killed by signal {-code}"
            update = StatusUpdate(handle.fqid, JobStatus.FAILED, exit_code=code, reason=reason)
        return None if update.status == handle.status else update

    # ----------------------------------------------------------- lifecycle
    async def aclose(self) -> None:
        """Stop every run still going: they cannot outlive this process's driver."""
        alive = [run for run in self._runs.values() if run.process.returncode is None]
        for run in alive:
            run.killed = True
            self._signal(run, signal.SIGKILL)
        with anyio.move_on_after(5, shield=True):
            for run in alive:
                await run.process.wait()
        self._send.close()
