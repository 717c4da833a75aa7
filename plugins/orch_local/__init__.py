"""``local``: run jobs as processes on this machine, through the home's launcher or the job wrapper.

A run is its program, started by the home's launcher (:mod:`.launcher`, :mod:`.hosted`): one long-lived process
that starts each run in a session of its own (killing its process group ends the application and all its
children, and it outlives the orchestrator) and writes what the wrapper writes. A run that needs the wrapper's
shell (its own ``shell``, declared output files, another owner, a shell built-in as its program) is
``sh wrapper.sh --env KEY COMMAND...``: one ``posix_spawn`` in a session of its own, its values in its
environment, no file written for it beforehand. The driver makes the run's
directories when it starts it (:func:`make_run_dirs`: the job dir, ``output``
and ``work``); the launcher or the wrapper makes the run's files. At most ``max_running`` run
at once (``[backends.local]`` in the config); the rest wait, ``submitted``, in
a queue per owner, the owners served in turn (fair share, not first come first
served), but for up to :data:`AHEAD` runs sent on to the launcher, which waits
for a slot itself and starts each without a round trip through this process.

The driver reports (``Capabilities(reports=True)``): it learns of a run's end
when it happens (from the launcher, or a pidfd per wrapper, in one epoll the event loop waits on),
reads the ``START`` and ``END`` lines from one append-only events
file then, and hands what changed to the runtime in one report (at most one
per :data:`REPORT_EVERY`). Nothing is polled, so a thousand running runs cost
nothing while nothing changes. Before each batch of starts the driver writes
their ``INTENT`` lines, so that a run is never started twice after a crash,
and it notes every run it accepts, so that one accepted but not yet started
when the process died is started by the next (:mod:`.journal`). Written
against the public driver API only.
"""

from __future__ import annotations

import math
import os
import stat
import time
from collections.abc import Mapping, Sequence
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
from orchestrator.plugin.fairshare import FairQueue
from orchestrator.plugin.processes import ExitWatcher, find_process, process_args, process_environ, reap
from orchestrator.plugin.users import read_inside
from orchestrator.plugin.wrapper import RUNFILE, BaseEnviron, boot_time, install_scripts, pid_alive

from .hosted import Launcher, hostable
from .journal import Journal, Record
from .kills import RunKills
from .runs import Run, Seed, SeedFrames, ending_of, logged_pid, owner_tag, start_batch, starts_inline, starts_of

#: Seconds between two looks at running wrappers no pidfd watches (no pidfds here, or none left).
LIVENESS_EVERY = 1.0
#: Most runs started in one go by one worker thread (their INTENT lines in one write, then their LAUNCH lines).
LAUNCH_BATCH = 16
#: Runs sent to the launcher past ``max_running``: it starts each as soon as one of its runs ends, where the driver
#: would start it only at its event loop's next turn, after the core's step on the last report (``_take``).
AHEAD = 32
#: Seconds an executable found runnable is not looked at again (a tick's thousand runs of it: one ``stat``).
EXECUTABLE_CHECKED_FOR = 1.0
#: Seconds between two reports: ends that come faster are gathered into one (a core step, a read of their logs
#: in one thread, a write), and a run that ends within it is reported ended, not first running.
REPORT_EVERY = 0.02
#: Batches started at once, each in a worker thread (each start waits for its process to exec: a millisecond or
#: more on a busy machine, during which the other workers go on).
SPAWNERS = 4


class LocalDriver(RunKills, Driver):
    name = "local"
    capabilities = Capabilities(runs_wrapper=True, lookup=True, reports=True)

    def __init__(self, context: DriverContext) -> None:
        super().__init__(context)
        self.bindir = context.home / "bin"
        self.wrapper = install_scripts(self.bindir)
        self.max_running = int(context.config.get("max_running", 64))
        self.kill_grace = float(context.config.get("kill_grace", 2.0))
        #: Seconds after an INTENT line without a process (the orchestrator died around the spawn) before the
        #: run is judged: started again if its wrapper never wrote START, else lost.
        self.start_timeout = float(context.config.get("start_timeout", 15.0))
        self.journal = Journal(context.statedir)
        self.events = self.journal.events
        #: The wrappers' own stdout and stderr (all runs: a wrapper writes there only when it fails before its log).
        self._out = os.open(context.statedir / "wrapper.out", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(self._out, 0o600)
        self._boot = boot_time()
        self._environ = BaseEnviron()
        #: The launcher's start messages of runs kept as seeds (what a template's runs share, encoded once).
        self._seeds = SeedFrames(str(self.wrapper.parent), self._boot)
        self._watcher = ExitWatcher()
        self._active: dict[str, Run] = {}
        self._by_pid: dict[int, Run] = {}
        #: Pids of running wrappers no pidfd watches: looked at every LIVENESS_EVERY.
        self._unwatched: set[int] = set()
        self._rechecks: list[Run] = []
        self._restarts: list[Run] = []
        #: Runs waiting for a slot, taken round-robin by owner (:mod:`orchestrator.plugin.fairshare`).
        self._queue: FairQueue[Run] = FairQueue(Run.owner)
        self._occupied = 0
        #: Of the slots taken, those of runs started by a wrapper of their own (none: runs may go ahead).
        self._wrapped = 0
        self._kills: list[tuple[float, int]] = []
        self._pending: dict[str, tuple[Run, StatusUpdate]] = {}
        self._wake = anyio.Event()
        self._report_wake = anyio.Event()
        self._last_look = 0.0
        self._closed = False
        #: Launch batches under way in worker threads (close waits for them: they use the driver's files).
        self._inflight = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._counts = {"launched": 0, "reports": 0, "batches": 0}
        self._checked: dict[str, float] = {}  # executable -> until when it is known runnable
        # the seed of the run accepted last: the next one shares its template if it can (Seed)
        self._last_seed: Seed | None = None
        self.journal.read()
        #: The home's launcher (:mod:`.hosted`): one an earlier process left is found now, with its runs.
        self._launcher = Launcher(context.statedir, self.journal.events, self._out, most=self.max_running)
        if (context.statedir / "launcher.sock").exists():
            self._launcher.connect(start=False)
        self._strays: dict[str, Run] = {}
        self._take_strays()  # killed wrappers an earlier process left: they hold their slots, and get their SIGKILL

    @classmethod
    def validate_settings(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(settings)
        for key, value in settings.items():
            if key != "shell":
                raise SettingsError(key, f"backend 'local' takes no setting {key!r} (it takes 'shell')")
            if not isinstance(value, str) or not value:
                raise SettingsError("shell", "shell must be the path of a POSIX sh")
        return out

    @classmethod
    def check_executable(cls, executable: str, settings: Mapping[str, Any]) -> str | None:
        """Runs start here: an absolute executable must exist and be executable now (a relative one is
        looked up in the run's PATH when it starts)."""
        if os.path.isabs(executable) and not (os.path.isfile(executable) and os.access(executable, os.X_OK)):
            return f"{executable} does not exist or is not executable"
        return None

    def metrics(self) -> dict[str, Any]:
        return {**self._counts, "queued": len(self._queue), "running": min(self._occupied, self.max_running),
                "ahead": max(0, self._occupied - self.max_running), "watched": len(self._watcher),
                "polled": len(self._unwatched), "tracked": len(self._by_pid)}

    # -------------------------------------------------------------- submit
    async def submit(self, run: RunSpec) -> str:
        if self._checked.get(run.executable, 0.0) < time.monotonic():  # checked at add(); it may have gone since
            problem = self.check_executable(run.executable, run.settings)
            if problem is not None:
                raise SubmitError(f"executable {problem}")
            self._checked[run.executable] = time.monotonic() + EXECUTABLE_CHECKED_FOR
        entry = Run.waiting(run, self.journal.record(run.key), self._last_seed)
        self._last_seed = entry.seed or self._last_seed
        self._active[run.key] = entry
        self.journal.accepted(run)
        self._queue.append(entry)
        self._wake.set()
        await anyio.lowlevel.checkpoint()  # the other submissions of this tick note theirs meanwhile
        self.journal.flush_accepted()  # one write for all of them (nothing left to write for the ones after)
        return run.key

    async def lookup(self, runs: Sequence[RunSpec]) -> list[str | None]:
        """A run was got if its launch began (an INTENT line); one only queued in a dead process never ran. Those
        got are followed from here on."""
        self._read_events()
        out: list[str | None] = []
        for r in runs:
            rec = self.journal.records.get(r.key)
            if rec is None or rec.intent_at is None:
                out.append(None)
                continue
            out.append(r.key)
            self._follow(r.key, r.fqid, str(r.settings.get("shell", "/bin/sh")), r.jobdir,
                         f"{r.outputdir}/orch.{r.attempt}.log", spec=r)
        self._restart()
        await anyio.lowlevel.checkpoint()
        return out

    async def track(self, handles: Sequence[RunHandle]) -> None:
        """Runs an earlier process accepted: ended meanwhile, running (watched again), or never started (started
        now, from what ``submitted.log`` says of them)."""
        self._read_events()
        for h in handles:
            self._follow(h.backend_id, h.fqid, str(h.settings.get("shell", "/bin/sh")), h.jobdir,
                         f"{h.outputdir}/orch.{h.attempt}.log", running=h.status != JobStatus.SUBMITTED)
        self._restart()
        await anyio.lowlevel.checkpoint()

    def _follow(self, key: str, fqid: str, shell: str, jobdir: Path, joblog: str, *, spec: RunSpec | None = None,
                running: bool = False) -> None:
        if self._own_stray(key, fqid) or key in self._active:
            return
        rec = self.journal.record(key)
        run = self._active[key] = Run(key, fqid, shell, str(jobdir), rec, spec=spec, joblog=joblog)
        if rec.ended:  # first: a run killed while it waited has its LOST line, and no INTENT
            self._end(run, ending_of(run))
        elif rec.intent_at is None:  # accepted, never launched
            self._start_again(run)
        elif self._wait_for_launcher(run):  # first: it may have started since the launcher said (its L comes)
            pass
        elif (pid := self._known_pid(key, rec)) is not None:  # (a program a launcher started while no orchestrator
            # ran has no LAUNCH line: its pid is in its log's START)
            if not self._adopt(run, pid, running) and not ((p := logged_pid(run)) and self._adopt(run, p, running)):
                self._gone(run)
        else:  # INTENT, no LAUNCH: its starter died around the spawn
            pid = (find_process(key)
                   or (find_process(str(jobdir / RUNFILE)) if jobdir.is_absolute() else None))
            if pid is None or not self._adopt(run, pid, running):
                run.recheck_at = rec.intent_at + self.start_timeout
                self._rechecks.append(run)

    def _known_pid(self, key: str, record: Record) -> int | None:
        """The run's process as told: by the launcher first (a hosted run's START line has the launcher's own pid,
        written before the program existed, and its LAUNCH line may not have been written), else by the events
        file (a wrapper's LAUNCH or START)."""
        return self._launcher.runs.get(key) or record.pid

    def _adopt(self, run: Run, pid: int, running: bool) -> bool:
        """Watch ``pid`` as ``run``'s wrapper if it is that (its key, or its old run file, in its arguments), or as
        its program if a launcher now gone started it (the run's own log in its environment, ``ORCH_JOBLOG``): a
        process of its own then, failed as lost when it ends, as when the launcher dies under a live driver."""
        if self._launcher.runs.get(run.key) == pid:  # the launcher's: watched through it
            run.hosted = True
        else:
            args = process_args(pid)
            old = run.jobdir.is_absolute() and os.fsencode(run.jobdir / RUNFILE) in args
            program = run.joblog is not None and b"ORCH_JOBLOG=" + os.fsencode(run.joblog) in process_environ(pid)
            if not (os.fsencode(run.key) in args or old or program) or not pid_alive(pid):
                return False
        run.pid = pid
        run.started()
        self._occupy(run, run.hosted)
        self._by_pid[pid] = run
        if not run.hosted and not self._watcher.watch(pid):
            self._unwatched.add(pid)
        if not running:
            self._queue_report(run, StatusUpdate(run.fqid, JobStatus.RUNNING))
        return True

    def _start_again(self, run: Run) -> None:
        """Start a run that never ran (with the others of the moment: :meth:`_restart`); it takes a slot again
        when its turn comes."""
        run.record.intent_at = None
        self._release(run)
        self._restarts.append(run)

    def _restart(self) -> None:
        """Queue the runs to start again: from what each was accepted with (one pass over ``submitted.log`` for
        all of them), or from an earlier version's run file."""
        runs, self._restarts = self._restarts, []
        wanted = {run.key for run in runs if run.spec is None and run.seed is None}
        specs = self.journal.accepted_specs(wanted) if wanted else {}
        for run in runs:
            run.spec = run.spec or specs.get(run.key)
            if run.spec is None and run.seed is None:
                run.runfile = _own_run_file(run)
                if run.runfile is None:
                    self._end(run, StatusUpdate(run.fqid, JobStatus.FAILED,
                                                reason="lost: no record of the run and no launch"))
                    continue
            self._queue.append(run)
        self._wake.set()

    # -------------------------------------------------------------- the loops
    async def serve(self) -> None:
        """Start queued runs as slots free up, learn of ends as they happen, report them, end lingering kills."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._watch_exits)
            tg.start_soon(self._report_loop)
            tg.start_soon(self._hear_launcher)
            while not self._closed:
                if self._wake.is_set():
                    self._wake = anyio.Event()
                now = time.time()
                self._finish_kills(now)
                self._look_around(now)
                while self._inflight < SPAWNERS and (batch := self._take()):
                    self._inflight += 1  # counted at once: _take sees the batch's slots taken
                    self._idle = anyio.Event() if self._idle.is_set() else self._idle
                    if starts_inline(batch):  # started on the loop all the same: no task of its own, but a
                        await self._launch(batch, inline=True)  # turn for the others after it (a run that
                        await anyio.lowlevel.checkpoint()  # fails to start frees its slot: the queue would drain)
                    else:
                        tg.start_soon(self._launch, batch)
                if (wait := self._next_deadline(now)) == math.inf:  # no cancel scope when nothing is due
                    await self._wake.wait()
                else:
                    with anyio.move_on_after(wait):
                        await self._wake.wait()
            tg.cancel_scope.cancel()

    async def _report_loop(self) -> None:
        """What changed since the last report, in one report (while one is being taken in, the next gathers)."""
        last = 0.0
        while not self._closed:
            await self._report_wake.wait()
            if (wait := last + REPORT_EVERY - time.monotonic()) > 0:  # a burst of ends: one report per window
                await anyio.sleep(wait)
            last = time.monotonic()
            self._report_wake = anyio.Event()
            pending, self._pending = self._pending, {}
            updates = [u for run, u in pending.values() if not run.silent]
            if updates and not self._closed:
                self._counts["reports"] += 1
                try:
                    await self.context.report(updates)
                except Exception as exc:  # the runtime's fault (closing): the ends are in the events file still
                    self.context.log.warning("report failed", backend=self.name, error=repr(exc), runs=len(updates))

    def _take(self) -> list[Run]:
        """The next batch to start; its runs take their slots now. Past ``max_running``, up to :data:`AHEAD` runs
        more go to the launcher, which starts each when one of its runs ends (no round trip through this loop):
        only runs it hosts, only while no wrapper holds a slot (a wrapper starts only in a free one: never more
        than ``max_running`` run at once), and only while no other owner's runs wait (theirs would wait behind)."""
        batch: list[Run] = []
        one_owner = len(self._queue.waiting()) == 1  # (once a batch: an owner that leaves only allows more)
        while self._queue and len(batch) < LAUNCH_BATCH:
            run = self._queue.peek()
            if run.ended or run.pid is not None or run.launching or self._active.get(run.key) is not run:
                self._queue.popleft()
                continue
            hosted = self._hostable(run)
            ahead = AHEAD if hosted and not self._wrapped and one_owner else 0
            if self._occupied >= self.max_running + ahead:
                break
            self._queue.popleft()
            run.launching = True
            self._occupy(run, hosted)
            batch.append(run)
        return batch

    def _hostable(self, run: Run) -> bool:
        """Whether the launcher starts ``run`` (:func:`.hosted.hostable`, and a launcher there, started if need be;
        a seed's template stands for its run: the fields it is judged on are shared)."""
        spec = run.seed.template if run.seed is not None else run.spec
        return spec is not None and hostable(spec) and self._launcher.connect(start=True)

    async def _launch(self, batch: list[Run], inline: bool = False) -> None:
        """INTENT lines (one write); the directories and the spawns, in a worker thread (or on the loop:
        :func:`.runs.starts_inline`); LAUNCH lines (one write)."""
        self._counts["batches"] += 1
        try:
            self.journal.write((run.key, "INTENT", owner_tag(run)) for run in batch)
            now = time.time()
            for run in batch:
                run.record.intent_at = now
            starts = starts_of(batch, self.wrapper, journal=self.journal, boot=self._boot, environ=self._environ,
                               launcher=self._launcher, seeds=self._seeds)
            await start_batch(starts, self._out, inline=inline)
            self._host(starts)
        except OSError as exc:  # no INTENT line could be written (a full disk...): nothing of the batch starts
            for run in batch:
                run.launching = False
                self._end(run, StatusUpdate(run.fqid, JobStatus.FAILED, reason=f"could not record its start: {exc}"))
            return
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()
            self._wake.set()  # another batch may start
        lines: list[tuple[str, str, object]] = []
        for start in starts:
            run = start.run
            if start.request is not None and start.problem is None and not run.silent:
                continue  # the launcher tells of its start (_hear_launcher)
            run.launching = False
            if start.pid is None and start.problem is None:  # killed before its turn: it never started
                lines.append(self._never_started(run))
                continue
            if start.problem is not None:
                lines.append(self._lost(run, JobStatus.FAILED, start.problem))
                continue
            assert start.pid is not None
            lines.append(self._launched(run, start.pid))
        if lines:
            try:
                self.journal.write(lines)
            except OSError as exc:  # they run and are watched; a restart finds them by their key
                self.context.log.warning("could not write LAUNCH lines", backend=self.name, error=repr(exc))

    def _look_around(self, now: float) -> None:
        """Runs nothing tells about: INTENTs without a process whose time came, wrappers no pidfd watches."""
        if self._rechecks:
            due = [r for r in self._rechecks if r.recheck_at is not None and r.recheck_at <= now]
            self._rechecks = [r for r in self._rechecks if r not in due]
            self._read_events()
            for run in due:
                if run.ended or self._wait_for_launcher(run):
                    continue
                pid = self._known_pid(run.key, run.record) or find_process(run.key)
                if pid is not None and self._adopt(run, pid, False):
                    continue
                if run.record.started:
                    self._gone(run)
                else:  # it never ran: this is its first start, not a second one
                    self._start_again(run)
            self._restart()
        if self._unwatched and now - self._last_look >= LIVENESS_EVERY:
            self._last_look = now
            gone = []
            for pid in list(self._unwatched):
                reap(pid)
                if not pid_alive(pid):
                    gone.append(pid)
                elif self._watcher.watch(pid):  # a descriptor came free
                    self._unwatched.discard(pid)
            if gone:
                self._exited(gone)

    def _next_deadline(self, now: float) -> float:
        times = [d for d, _ in self._kills]
        times += [r.recheck_at for r in self._rechecks if r.recheck_at is not None]
        if self._unwatched:
            times.append(self._last_look + LIVENESS_EVERY)
        return max(0.0, min(times) - now) if times else math.inf

    async def forget(self, handles: Sequence[RunHandle]) -> None:
        """No more interest in these runs: their ends are not reported, and one still queued never starts."""
        for h in handles:
            run = self._active.get(h.backend_id)
            if run is not None:
                run.silent = True
                if run.pid is None and not run.launching:
                    self._end(run, StatusUpdate(run.fqid, JobStatus.KILLED))
                elif run.pid is None and run.hosted:  # waiting at the launcher: it never starts there either
                    self._launcher.withdraw(run.key)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._report_wake.set()
        with anyio.move_on_after(10):  # starts under way in worker threads finish with the files still open
            await self._idle.wait()
        self._watcher.close()
        for pid in list(self._by_pid):
            reap(pid)
        self._launcher.drop()  # it goes on while its runs do, then ends
        self._launcher.reap(wait=True)
        self.journal.close()
        os.close(self._out)


def _own_run_file(run: Run) -> Path | None:
    """The run file an earlier version of the driver wrote for ``run``, if it may be trusted: the wrapper sources it,
    as this process's user. It must be that user's, in a job dir of that user's whose parent is too (no one else
    could have put it there, or swap the dir), and name the run's key. A team service's job dirs are their
    owners': an owner's file there was run as the service's user (root), given a crash between a run's acceptance
    and its note in ``submitted.log``."""
    runfile = run.jobdir / RUNFILE
    me = os.geteuid()
    try:
        for where, kind in ((run.jobdir.parent, stat.S_ISDIR), (run.jobdir, stat.S_ISDIR), (runfile, stat.S_ISREG)):
            st = os.lstat(where)
            if not kind(st.st_mode) or st.st_uid != me or st.st_mode & 0o022:
                return None
        text = read_inside(runfile, run.jobdir, 1 << 20).decode(errors="replace")
    except OSError:
        return None
    return runfile if f"ORCH_KEY={run.key}\n" in text or f"ORCH_KEY='{run.key}'\n" in text else None
