"""How the ``local`` driver learns that its runs started and ended, and what it does then: a wrapper's exit (its
pidfd), the launcher's word, the events file read on either; a run's end recorded and reported, its slot taken
(:meth:`RunEnds._occupy`) and given back.

A part of :class:`~orch_local.LocalDriver` (its base class): one object owns the driver's state, which
``LocalDriver.__init__`` makes; this file only holds the methods that deal with ends, for the driver's file to
stay readable. The attributes below are the driver's, named here for the type checker.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

import anyio

from orchestrator.plugin import DriverContext, JobStatus, StatusUpdate
from orchestrator.plugin.fairshare import FairQueue
from orchestrator.plugin.processes import ExitWatcher, reap

from .hosted import Launcher
from .journal import Journal
from .runs import KILLED_ON_REQUEST, NEVER_STARTED, Run, Start, ending_of


class RunEnds:
    context: DriverContext
    journal: Journal
    start_timeout: float
    _launcher: Launcher
    _watcher: ExitWatcher
    _active: dict[str, Run]
    _by_pid: dict[int, Run]
    _unwatched: set[int]
    _rechecks: list[Run]
    _queue: FairQueue[Run]
    _pending: dict[str, tuple[Run, StatusUpdate]]
    _occupied: int
    _wrapped: int
    _counts: dict[str, int]
    _closed: bool
    _wake: anyio.Event
    _report_wake: anyio.Event

    def _signal(self, run: Run) -> None:
        raise NotImplementedError  # the driver's (stopping a run)

    async def _watch_exits(self) -> None:
        while True:
            try:
                pids = await self._watcher.ended()
            except anyio.ClosedResourceError:
                return
            self._exited(pids)

    def _read_events(self) -> None:
        for key, word, _ in self.journal.read():
            if word in ("END", "LOST"):
                run = self._active.get(key)
                if run is not None:
                    self._end(run, ending_of(run))

    def _gone(self, run: Run) -> None:
        """The run's wrapper is gone, and the events file (read last) has no END for it."""
        if run.ended:
            return
        if run.killed or run.record.kill_by is not None:  # SIGTERM, or SIGKILL after it: its end as asked
            self.journal.write([self._lost(run, JobStatus.KILLED, KILLED_ON_REQUEST)])
            return
        reason = ("the wrapper ended without an END line (killed or crashed)" if run.record.started
                  else "the wrapper never started")
        self.journal.write([self._lost(run, JobStatus.FAILED, reason)])

    def _lost(self, run: Run, status: JobStatus, reason: str) -> tuple[str, str, object]:
        """The run ended without its wrapper's word (``status``, ``reason``): recorded and reported; the LOST
        line for the journal, which the caller writes (with others of its batch)."""
        run.record.ended, run.record.reason = True, reason
        self._end(run, StatusUpdate(run.fqid, status, reason=reason))
        return (run.key, "LOST", reason)

    def _never_started(self, run: Run) -> tuple[str, str, object]:
        """``run``, killed while it waited its turn, ended so (its LOST line, which a restart reads as killed)."""
        return self._lost(run, JobStatus.KILLED, NEVER_STARTED)

    def _end(self, run: Run, update: StatusUpdate) -> None:
        if run.ended:
            return
        run.ended = True
        if self._active.get(run.key) is run:
            del self._active[run.key]
            self.journal.settle(run.key)
        if run.hosted and run.pid is not None and self._by_pid.get(run.pid) is run:
            del self._by_pid[run.pid]  # its END may be read before the launcher's word of it: no E to drop it then
        if run.hosted and run.launching:  # its START and END read before the launcher's word of its start
            run.launching = False
            self._counts["launched"] += run.record.started
        self._release(run)
        self._queue_report(run, update)

    def _queue_report(self, run: Run, update: StatusUpdate) -> None:
        if update.status == JobStatus.RUNNING and run.ended:
            return  # its end was read first (a short run, ended while its batch was still being started)
        self._pending[run.key] = (run, update)  # an end replaces a running not yet reported
        self._report_wake.set()

    def _exited(self, pids: Sequence[int]) -> None:
        for pid in pids:
            reap(pid)
            self._unwatched.discard(pid)
        self._read_events()  # the END lines of these (a wrapper writes its END before it exits)
        for pid in pids:
            run = self._by_pid.pop(pid, None)
            if run is not None:
                self._gone(run)

    def _host(self, starts: Sequence[Start]) -> None:
        """The hosted runs of a batch to the launcher, in one write. If it cannot be reached they are judged as after
        a crash around their spawn (a run is never started twice): started again unless the events file says it
        started."""
        sent = [s for s in starts if s.request is not None and s.problem is None and not s.run.silent]
        if sent and not self._launcher.send(b"".join(s.request for s in sent if s.request is not None)):
            for start in sent:
                start.run.launching = False
                start.run.recheck_at = time.time() + self.start_timeout
                self._rechecks.append(start.run)

    async def _hear_launcher(self) -> None:
        """The launcher's word: a run started (its LAUNCH line, reported running) or ended (the events file read,
        as on a wrapper's exit); and, when it has gone, its runs looked after as any no pidfd watches."""
        while not self._closed:
            batch = await self._launcher.receive()
            self._launcher.reap()
            if self._closed:
                return
            if batch is None:
                self._launcher_lost()
                await self._launcher.connected.wait()
                continue
            lines: list[tuple[str, str, object]] = []
            ended = []
            for fields in batch:
                run = self._active.get(fields[1].decode()) if len(fields) > 1 else None
                if run is None or run.ended:
                    continue
                if fields[0] == b"E" and run.launching and run.silent:  # dropped while it waited (K, D)
                    run.launching = False
                    lines.append(self._never_started(run))
                elif fields[0] == b"E":
                    ended.append(run)
                elif fields[0] == b"L" and run.launching:
                    run.launching = False
                    if (pid := int(fields[2])) == 0:  # ended at once (not found, no work dir): its E follows
                        run.started()
                        continue
                    lines.append(self._launched(run, pid))
            if lines:
                with contextlib.suppress(OSError):  # they run; a restart finds them through the launcher
                    self.journal.write(lines)
            if ended:
                self._read_events()
                for run in ended:
                    if run.pid is not None:
                        self._by_pid.pop(run.pid, None)
                    self._gone(run)

    def _launched(self, run: Run, pid: int) -> tuple[str, str, object]:
        """``run`` runs as ``pid`` (its wrapper's, or its program's under the launcher): watched, reported running
        (stopped at once if it was killed while it started); its LAUNCH line, which the caller writes with its
        batch's."""
        run.pid = run.record.pid = pid
        run.started()
        self._by_pid[pid] = run
        if not run.hosted and not self._watcher.watch(pid):
            self._unwatched.add(pid)
        self._counts["launched"] += 1
        if run.killed:
            self._signal(run)
        else:
            self._queue_report(run, StatusUpdate(run.fqid, JobStatus.RUNNING))
        return (run.key, "LAUNCH", pid)

    def _wait_for_launcher(self, run: Run) -> bool:
        """Whether the launcher holds ``run``, waiting its turn (sent ahead by an earlier process): its start is
        told then, as any of its runs'."""
        if self._launcher.runs.get(run.key) != 0:
            return False
        run.launching = True
        self._occupy(run, True)
        return True

    def _occupy(self, run: Run, hosted: bool) -> None:
        """``run`` holds a slot (once), started by the launcher (``hosted``) or by a wrapper of its own."""
        if not run.occupies:
            run.occupies = True
            self._occupied += 1
        elif not run.hosted:
            self._wrapped -= 1
        run.hosted = hosted
        if not hosted:
            self._wrapped += 1

    def _release(self, run: Run) -> None:
        """``run``'s slot given back (ended, or to wait its turn again)."""
        if run.occupies:
            run.occupies = False
            self._occupied -= 1
            if not run.hosted:
                self._wrapped -= 1
            self._wake.set()

    def _launcher_lost(self) -> None:
        """The launcher is gone (killed: it never ends while it has runs). Its runs are looked at as any no pidfd
        watches (signalled by the driver itself). One whose start it never told (``L``) is judged as after a crash
        around its spawn, its slot held until then: failed as lost if its START line is there (the launcher writes
        it before the spawn, with its own pid: the program may run, by a pid no one knows), else started again."""
        self._read_events()
        for run in [r for r in self._active.values() if r.hosted and not r.ended]:
            if run.launching:
                run.launching = False
                run.recheck_at = time.time() + self.start_timeout
                self._rechecks.append(run)
                continue
            if run.pid is not None:  # a process of its own now, as a wrapper's: none goes ahead while it runs, as a
                self._occupy(run, False)  # new launcher would not count it against its ``most``
                self._unwatched.add(run.pid)
        self._wake.set()
