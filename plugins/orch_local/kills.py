"""How the ``local`` driver stops runs: SIGTERM to a run's process group, SIGKILL ``kill_grace`` later, and the
killed wrappers an earlier process left running.

A run the launcher started is stopped by the launcher, which sends both signals itself and so outlives the
orchestrator's death in between. A wrapper is signalled by the driver; before the SIGTERM, it writes the wrapper's
``KILL`` line (when its SIGKILL is due) in the events file. If the process dies before that time, the next one
finds the line (when it makes its driver): a wrapper still running there (its key in its arguments) holds a slot
against ``max_running`` until it ends, and gets its SIGKILL when it is due; one gone meanwhile gets its ``LOST``
line, and what is left of its process group (a child that outlived it, known by its environment) its SIGKILL.
Either way the run ends ``killed``, reported so if the core still had it active (a process that died between the
signal and the kill's write-ahead).

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
from orchestrator.plugin.processes import process_args, process_environ
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
            if os.fsencode(run.key) in process_args(pid):  # a wrapper (not a program its launcher, gone, started)
                run.record.kill_by = deadline
                with contextlib.suppress(OSError):  # not written (a full disk): signalled all the same
                    self.journal.write([(run.key, "KILL", f"{pid} {deadline:.3f}")])
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
            if (other := self._by_pid.get(pid)) is not None and not other.killed:
                continue  # the group ended, and its number is a run's started since (pids wrap at 32768 here)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self._kills = keep

    def _take_strays(self) -> None:
        """What killed wrappers an earlier process left (its KILL lines, as the events file is first read): a
        wrapper still running is watched, holds a slot and gets its SIGKILL when due; one gone is lost, killed; and
        what is left of its process group (a child that outlived it) gets the SIGKILL too (:meth:`_kill_leftovers`)."""
        lines: list[tuple[str, str, object]] = []
        left: list[tuple[str, int, float]] = []
        for key, record in self.journal.take_kills():
            pid, deadline = record.pid, record.kill_by or 0.0
            if pid is None:
                continue
            alive = pid_alive(pid)
            run = Run(key, key, "/bin/sh", "", record, pid=pid, silent=True, killed=True)  # (its fqid: if tracked)
            if not record.ended and alive and os.fsencode(key) in process_args(pid):
                self._active[key] = self._strays[key] = self._by_pid[pid] = run
                if not self._watcher.watch(pid):
                    self._unwatched.add(pid)
                self._occupy(run, False)
                self._kills.append((deadline, pid))
                continue
            if not alive and _group_left(pid):
                left.append((key, pid, deadline))
            if not record.ended:
                lines.append(self._lost(run, JobStatus.KILLED, KILLED_ON_REQUEST))
        if left:
            self._kill_leftovers(left)
        if lines:
            with contextlib.suppress(OSError):  # not written: the next process looks again
                self.journal.write(lines)

    def _kill_leftovers(self, left: list[tuple[str, int, float]]) -> None:
        """``(key, pgid, deadline)``: process groups whose killed wrapper has ended, each SIGKILLed when due if one of
        its processes is the run's: its ``ORCH_FQID`` and ``ORCH_ATTEMPT``, and its ``ORCH_JOBLOG`` in this home,
        in its environment (the group's number may be another's by now; the key is the wrapper's alone)."""
        members = _members({pgid for _, pgid, _ in left})
        home = b"ORCH_JOBLOG=" + os.fsencode(self.context.home) + b"/"
        for key, pgid, deadline in left:
            _, fqid, attempt = key.rsplit("-", 2)
            marks = (b"ORCH_FQID=" + fqid.encode(), b"ORCH_ATTEMPT=" + attempt.encode())
            for pid in members.get(pgid, ()):
                env = process_environ(pid)
                if all(m in env for m in marks) and any(e.startswith(home) for e in env):
                    self._kills.append((deadline, pgid))
                    break

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


def _group_left(pgid: int) -> bool:
    """Whether the process group ``pgid`` still has a process."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _members(pgids: set[int]) -> dict[int, list[int]]:
    """The live processes of each of the process groups ``pgids`` (one pass over ``/proc``)."""
    found: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if (pgid := int(fields[2])) in pgids and fields[0] not in (b"Z", b"X"):
                found.setdefault(pgid, []).append(int(entry.name))
    return found
