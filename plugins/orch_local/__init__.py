"""``local``: run jobs as processes on this machine, through the job wrapper.

Each run is ``sh wrapper.sh RUNFILE``, started with ``posix_spawn`` in a new
session, so that killing its process group ends the application and all
its children, and so that it outlives the orchestrator. At most
``max_running`` run at once (``[backends.local]`` in the config); the rest
wait in a queue, ``submitted``.

Monitoring reads one append-only events file that every wrapper writes a
line to when it starts and ends (``ORCH_NOTIFY``), so a tick costs the new
bytes of one file, not a look at every job. A reopened home finds what its
runs did in that file; before each spawn the driver writes an ``INTENT``
line, so a run is never started twice after a crash. Written against the
public driver API only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

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
from orchestrator.plugin.wrapper import (
    RUNFILE,
    EventLines,
    SpawnError,
    clear_outputs,
    install_scripts,
    pid_alive,
    prepare_local,
    read_log,
    reap_children,
    spawn_wrapper,
)

#: Seconds between two liveness checks of running wrappers.
LIVENESS_EVERY = 1.0
#: Seconds between two collections of exited wrappers when nothing else is to do (no zombie stays longer).
CHILD_REAP_EVERY = 0.5


@dataclass
class _Run:
    key: str
    runfile: Path
    shell: str
    pid: int | None = None
    intent_at: float | None = None
    started: bool = False
    end_code: int | None = None
    ended: bool = False
    reason: str | None = None


def _wrapper_pid(runfile: Path) -> int | None:
    """The pid of a live wrapper started on ``runfile`` (its command line names the file), if any."""
    needle = os.fsencode(runfile)
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:  # gone meanwhile, or not ours to read
                continue
            if needle in argv and pid_alive(int(entry.name)):
                return int(entry.name)
    return None


class LocalDriver(Driver):
    name = "local"
    capabilities = Capabilities(bulk_status=True, runs_wrapper=True, lookup=True)

    def __init__(self, context: DriverContext) -> None:
        super().__init__(context)
        self.bindir = context.home / "bin"
        self.wrapper = install_scripts(self.bindir)
        self.events = context.statedir / "events.log"
        self.events.touch(exist_ok=True)
        self.max_running = int(context.config.get("max_running", 64))
        self.kill_grace = float(context.config.get("kill_grace", 2.0))
        #: Seconds a run may sit between INTENT and its wrapper's START before it counts as lost.
        self.start_timeout = float(context.config.get("start_timeout", 15.0))
        self._runs: dict[str, _Run] = {}
        self._queue: deque[_Run] = deque()
        self._children: set[int] = set()
        self._event_lines = EventLines()
        self._kills: list[tuple[float, int]] = []
        self._wake = anyio.Event()
        self._last_liveness = 0.0
        #: Runs with a line in the events file since the last status query: between liveness checks, only
        #: these are judged again (a tick over a thousand quiet runs costs a look-up each, nothing more).
        self._news: set[str] = set()
        self._read_events()

    @classmethod
    def validate_settings(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(settings)
        for key, value in settings.items():
            if key != "shell":
                raise SettingsError(key, f"backend 'local' takes no setting {key!r} (it takes 'shell')")
            if not isinstance(value, str) or not value:
                raise SettingsError("shell", "shell must be the path of a POSIX sh")
        return out

    # -------------------------------------------------------------- events
    def _append(self, key: str, word: str, data: object) -> None:
        with open(self.events, "a", encoding="utf-8") as f:
            f.write(f"{key} {word} {data} {time.time():.3f}\n")

    def _read_events(self) -> None:
        for parts in self._event_lines.read(self.events):
            key, word, value = parts[0], parts[1], parts[2]
            self._news.add(key)
            run = self._runs.get(key)
            if run is None:
                run = self._runs[key] = _Run(key, Path(), "")
            if word == "INTENT":
                run.intent_at = float(parts[3]) if len(parts) > 3 else time.time()
            elif word in ("LAUNCH", "START"):
                run.pid = int(value) if value.isdigit() else run.pid
                run.started = run.started or word == "START"
            elif word == "END":
                run.ended, run.end_code = True, int(value) if value.lstrip("-").isdigit() else None
            elif word == "LOST":
                run.ended, run.reason = True, " ".join(parts[2:-1])

    @classmethod
    def check_executable(cls, executable: str, settings: Mapping[str, Any]) -> str | None:
        """Runs start here: an absolute executable must exist and be executable now (a relative one is
        looked up in the run's PATH when it starts)."""
        if os.path.isabs(executable) and not (os.path.isfile(executable) and os.access(executable, os.X_OK)):
            return f"{executable} does not exist or is not executable"
        return None

    # -------------------------------------------------------------- submit
    async def submit(self, run: RunSpec) -> str:
        shell = str(run.settings.get("shell", "/bin/sh"))
        problem = self.check_executable(run.executable, run.settings)
        if problem is not None:  # checked at add(); the file may have gone since
            raise SubmitError(f"executable {problem}")
        clear_outputs(run.outputdir)
        runfile = prepare_local(run, bindir=self.bindir, notify=self.events)
        entry = _Run(run.key, runfile, shell)
        self._runs[run.key] = entry
        self._queue.append(entry)
        self._wake.set()
        await anyio.lowlevel.checkpoint()
        return run.key

    async def lookup(self, runs: Sequence[RunSpec]) -> list[str | None]:
        """A run was got if its launch began (an INTENT line); one only queued in a dead process never ran."""
        self._read_events()
        await anyio.lowlevel.checkpoint()
        return [r.key if (got := self._runs.get(r.key)) is not None and got.intent_at is not None else None
                for r in runs]

    def _running(self) -> int:
        return sum(1 for r in self._runs.values() if r.pid is not None and not r.ended)

    def _launch(self, run: _Run) -> None:
        self._append(run.key, "INTENT", "-")
        run.intent_at = time.time()
        try:
            pid = spawn_wrapper(run.shell, self.wrapper, run.runfile)
        except SpawnError as exc:
            run.ended, run.reason = True, str(exc)
            self._append(run.key, "LOST", run.reason)
            return
        run.pid = pid
        self._children.add(pid)
        self._append(run.key, "LAUNCH", pid)

    async def serve(self) -> None:
        """Start queued runs as slots free up; end killed process groups that linger."""
        while True:
            reap_children(self._children)
            free = self.max_running - self._running()
            launched = 0
            while self._queue and free > 0:
                run = self._queue.popleft()
                if run.ended or run.pid is not None:
                    continue
                self._launch(run)
                free -= 1
                launched += 1
                if launched % 64 == 0:
                    await anyio.sleep(0)
            self._finish_kills()
            if self._queue or self._kills or self._children:
                if not launched or not self._queue:
                    await anyio.sleep(0.02)
                if self._queue and free <= 0:
                    self._read_events()
            else:
                self._wake = anyio.Event()
                await self._wake.wait()
            if not self._queue and not self._kills and self._children:
                # only children to reap (their ends are read from the events file): not 50 times a second
                self._wake = anyio.Event()
                with anyio.move_on_after(CHILD_REAP_EVERY):
                    await self._wake.wait()

    # -------------------------------------------------------------- status
    async def status_bulk(self, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        reap_children(self._children)
        self._read_events()
        now = time.time()
        check_alive = now - self._last_liveness >= LIVENESS_EVERY
        if check_alive:
            self._last_liveness = now
        news, self._news = self._news, set()
        updates = []
        for h in handles:
            if not check_alive and h.backend_id not in news:
                run = self._runs.get(h.backend_id)
                if run is not None and not run.ended:
                    continue  # nothing new since it was last judged
            update = self._status_of(h, now, check_alive)
            if update is not None and update.status != h.status:
                updates.append(update)
        await anyio.lowlevel.checkpoint()
        return updates

    def _status_of(self, h: RunHandle, now: float, check_alive: bool) -> StatusUpdate | None:
        run = self._runs.get(h.backend_id)
        if run is None:
            return self._adopt(h)
        if run.ended:
            if run.reason is not None:
                return StatusUpdate(h.fqid, JobStatus.FAILED, reason=run.reason)
            log = read_log(h.outputdir, h.attempt)
            code = run.end_code if run.end_code is not None else log.exit_code
            if code == 0:
                return StatusUpdate(h.fqid, JobStatus.COMPLETED, exit_code=0)
            return StatusUpdate(h.fqid, JobStatus.FAILED, exit_code=code, reason=f"exit code {code}")
        if run.pid is None and run.intent_at is None:
            return None  # queued
        alive = run.pid is not None and (run.pid in self._children or not check_alive or pid_alive(run.pid))
        if run.started:
            if alive:
                return StatusUpdate(h.fqid, JobStatus.RUNNING)
            return self._lost(run, h, "the wrapper ended without an END line (killed or crashed)")
        if run.intent_at is not None and now - run.intent_at > self.start_timeout and not alive:
            if run.pid is None:  # the process that meant to launch it died around the spawn
                return self._after_interrupted_launch(run, h)
            return self._lost(run, h, "the wrapper never started")
        return None

    def _after_interrupted_launch(self, run: _Run, h: RunHandle) -> StatusUpdate | None:
        """INTENT but no LAUNCH: find the wrapper by its run file, or, if there is none and it never wrote
        START, launch it now: it never ran, so this is its first start, not a second one."""
        runfile = h.outputdir.parent / RUNFILE
        pid = _wrapper_pid(runfile)
        if pid is not None:
            run.pid = pid
            self._append(run.key, "LAUNCH", pid)
            return None
        if not run.runfile.name:
            run.runfile, run.shell = runfile, str(h.settings.get("shell", "/bin/sh"))
        run.intent_at = None
        self._queue.append(run)
        self._wake.set()
        return None

    def _lost(self, run: _Run, h: RunHandle, reason: str) -> StatusUpdate:
        run.ended, run.reason = True, reason
        self._append(run.key, "LOST", reason)
        return StatusUpdate(h.fqid, JobStatus.FAILED, reason=reason)

    def _adopt(self, h: RunHandle) -> StatusUpdate | None:
        """A run submitted by an earlier orchestrator that never got to launch it: queue it now."""
        runfile = h.outputdir.parent / RUNFILE
        try:
            text = runfile.read_text()
        except FileNotFoundError:
            return StatusUpdate(h.fqid, JobStatus.FAILED, reason="lost: no run file and no record of a launch")
        if f"ORCH_KEY={h.backend_id}\n" not in text and f"ORCH_KEY='{h.backend_id}'\n" not in text:
            return StatusUpdate(h.fqid, JobStatus.FAILED, reason="lost: the run file belongs to another run")
        entry = _Run(h.backend_id, runfile, str(h.settings.get("shell", "/bin/sh")))
        self._runs[h.backend_id] = entry
        self._queue.append(entry)
        self._wake.set()
        return None

    # ---------------------------------------------------------------- kill
    async def kill(self, handle: RunHandle) -> None:
        run = self._runs.get(handle.backend_id)
        if run is None or run.ended:
            return
        if run.pid is None:
            run.ended, run.reason = True, "killed before it started"
            self._append(run.key, "LOST", run.reason)
            return
        try:
            os.killpg(run.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        self._kills.append((time.time() + self.kill_grace, run.pid))
        self._wake.set()
        await anyio.lowlevel.checkpoint()

    def _finish_kills(self) -> None:
        now = time.time()
        keep = []
        for deadline, pid in self._kills:
            if now < deadline:
                keep.append((deadline, pid))
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self._kills = keep

    async def aclose(self) -> None:
        reap_children(self._children)
