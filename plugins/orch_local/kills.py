"""How the ``local`` driver stops runs: SIGTERM to a run's process group, SIGKILL ``kill_grace`` later, and the
killed wrappers an earlier process left running.

A run the launcher started is stopped by the launcher, which sends both signals itself and so outlives the
orchestrator's death in between. A wrapper is signalled by the driver; before the SIGTERM, it writes the wrapper's
``KILL`` line (when its SIGKILL is due) in the events file. If the process dies before that time, the next one
finds the line without an end for the run: a wrapper still running there (its key in its arguments) holds a slot
against ``max_running`` until it ends, and gets its SIGKILL when it is due; one gone meanwhile gets its ``LOST``
line. Either way the run ends ``killed``, reported so if the core still had it active (a process that died
between the signal and the kill's write-ahead).

A part of :class:`~orch_local.LocalDriver` (a base class, as :class:`~.ends.RunEnds`): the state is the
driver's, made in its ``__init__``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import anyio

from orchestrator.plugin import JobStatus, RunHandle, StatusUpdate
from orchestrator.plugin.processes import find_process, process_args
from orchestrator.plugin.wrapper import pid_alive

from .ends import RunEnds
from .runs import KILLED_ON_REQUEST, Run


class RunKills(RunEnds):
    kill_grace: float
    #: ``(when, pid)``: process groups due their SIGKILL.
    _kills: list[tuple[float, int]]
    #: Killed wrappers an earlier process left running, by key, until the core asks for them (:meth:`_own_stray`).
    _strays: dict[str, Run]

    async def kill(self, handle: RunHandle) -> None:
        run = self._active.get(handle.backend_id)
        if run is None or run.ended:
            return
        run.silent = run.killed = True
        if run.pid is None:
            if not run.launching:  # queued: it never starts (one being launched is stopped by _launch)
                self.journal.write([self._never_started(run)])
            elif run.hosted:  # waiting at the launcher: dropped there (its E), or, started meanwhile, stopped
                self._launcher.kill(run.key, self.kill_grace)
            return
        self._signal(run)
        await anyio.lowlevel.checkpoint()

    def _signal(self, run: Run) -> None:
        """SIGTERM to the run's process group now (by its launcher, which then records its end as killed), SIGKILL
        after ``kill_grace`` (a wrapper's: its KILL line first, for the next process to send it if this one is gone
        by then)."""
        assert run.pid is not None
        pid = run.pid
        deadline = time.time() + self.kill_grace
        if not (run.hosted and self._launcher.kill(run.key, self.kill_grace)):
            if not run.hosted:
                run.record.kill_by = deadline
                with contextlib.suppress(OSError):  # not written (a full disk): signalled all the same
                    self.journal.write([(run.key, "KILL", f"{deadline:.3f}")])
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                return
        self._kills.append((deadline, pid))
        self._wake.set()

    def _finish_kills(self, now: float) -> None:
        keep = []
        for deadline, pid in self._kills:
            if now < deadline:
                keep.append((deadline, pid))
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self._kills = keep

    def _take_strays(self) -> None:
        """The killed wrappers an earlier process left (KILL lines without an end, as the events file is first
        read): each still running is watched, holds a slot and gets its SIGKILL when due; each gone is lost, killed."""
        lines: list[tuple[str, str, object]] = []
        for key, record in self.journal.take_kills():
            pid = record.pid or find_process(key)  # (none told: it died before the wrapper's START and LAUNCH)
            run = Run(key, key, "/bin/sh", "", record, pid=pid, silent=True, killed=True)
            if pid is not None and os.fsencode(key) in process_args(pid) and pid_alive(pid):
                self._active[key] = self._strays[key] = self._by_pid[pid] = run
                if not self._watcher.watch(pid):
                    self._unwatched.add(pid)
                self._occupy(run, False)
                self._kills.append((record.kill_by or 0.0, pid))
            else:
                lines.append(self._lost(run, JobStatus.KILLED, KILLED_ON_REQUEST))
        if lines:
            with contextlib.suppress(OSError):  # not written: the next process looks again
                self.journal.write(lines)

    def _own_stray(self, key: str, fqid: str) -> bool:
        """Whether ``key`` is a stray's (:meth:`_take_strays`), which the core still has active (its kill was not
        on record when the earlier process died): its end is reported, killed, now or when it comes."""
        run = self._strays.pop(key, None)
        if run is None:
            return False
        run.fqid, run.silent = fqid, False
        if run.ended:
            self._queue_report(run, StatusUpdate(fqid, JobStatus.KILLED, reason=KILLED_ON_REQUEST))
        return True
