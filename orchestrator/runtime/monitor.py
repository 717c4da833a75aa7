"""Monitoring one backend: what its driver says of the runs it holds, made into ``StatusReport`` events.

A polled driver is asked every ``poll_interval`` about the runs its actor
holds; a reporting driver calls ``context.report`` when it learns
something. Either way the answers go through the same steps:

- sense: a report for a run nobody holds, or one that is not a
  ``StatusUpdate``, is logged and counts as no answer; a backend whose query
  raises is asked again with backoff. A run with no intelligible answer for
  ``lost_after_seconds`` is reported lost (``RunLost``).
- a run's end is read where it happened: the wrapper's log of that attempt,
  the last lines of its stderr, the newest checkpoint it saved; the driver
  lets go of it, and the state machine judges it from what came with the
  report.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import structlog

from ..checkpoint import STATE_DIR
from ..core.events import Event, RunLost, RunReport, StatusReport
from ..core.ids import Runs, parse_fqid_or_none
from ..core.statuses import ENDINGS, STARTED, JobStatus
from ..plugin.contract import RunHandle, StatusUpdate
from . import bulk, gcpause
from .actor import Actor
from .held import RunKey
from .runs import Ending, RunFiles

#: Seconds between two looks for saved states at running runs of jobs that saved none yet (one ``stat`` each)...
DISCOVER_SECONDS = 5.0
#: ... and at most this many such looks per second on average: a thousand runs are looked at every 50 s (an idle
#: service's cost stays flat as runs grow; a run's states are always read when it ends, and a run that saved one
#: is looked at every tick from then on).
DISCOVER_RATE = 20.0


@dataclass
class Health:
    """Since when each run (and the backend) has had no intelligible answer."""

    lost_after: float
    poll_interval: float
    runs: dict[RunKey, float] = field(default_factory=dict)
    failures: int = 0
    resume_at: float = 0.0

    def may_poll(self, now: float) -> bool:
        return now >= self.resume_at

    def answered(self, keys: Sequence[RunKey]) -> None:
        self.failures, self.resume_at = 0, 0.0
        for key in keys:
            self.runs.pop(key, None)

    def silent(self, keys: Sequence[RunKey], now: float, *, whole_backend: bool) -> list[RunKey]:
        """Record no answer for ``keys``; return those silent for longer than ``lost_after``."""
        if whole_backend:
            self.failures += 1
            self.resume_at = now + min(self.poll_interval * 2 ** min(self.failures, 10), 30.0)  # backoff
        lost = []
        for key in keys:
            since = self.runs.setdefault(key, now)
            if now - since >= self.lost_after:
                lost.append(key)
                del self.runs[key]
        return lost


class Monitor:
    """Watches the runs an :class:`Actor` holds; see the module docstring."""

    def __init__(self, actor: Actor, *, post: Callable[[Event], Awaitable[None]],
                 files: RunFiles, status_of: Callable[[RunKey], JobStatus | None],
                 poll_interval: float, lost_after: float, concurrency: int, log: Any) -> None:
        self.actor = actor
        self.post = post
        self.status_of = status_of
        #: What a run saved while it runs, and what it left when it ended.
        self.files = files
        self.poll_interval = poll_interval
        self.health = Health(lost_after, poll_interval)
        self.concurrency = concurrency
        self.log = log
        self.ticks = 0
        #: Seconds the last polled tick took, from its query to its reports posted (for the metrics).
        self.last_tick = 0.0
        #: A graceful stop: no new tick starts.
        self.stopped = False
        self._seq = 0
        #: When running runs not yet known to save states are looked at next (``time.monotonic()``).
        self._discover_at = 0.0
        #: The handles of the running runs the last discovery round looked at, by key (kept while they run).
        self._looking: dict[RunKey, RunHandle] = {}

    @property
    def name(self) -> str:
        return self.actor.name

    # ------------------------------------------------------------ polled drivers
    async def poll_forever(self) -> None:
        while True:
            await anyio.sleep(self.poll_interval)
            await self.poll()
            await self.harvest_running()

    async def harvest_running(self) -> None:
        """States saved by runs going on reach the repository, and the newest the state machine, each tick.

        Runs of jobs with steps, or that saved a state already, are looked at every tick; any other running
        run (a job without steps may start saving states at any time) once every :data:`DISCOVER_SECONDS`, or
        less often when there are many (:data:`DISCOVER_RATE`).
        A driver with ``remote_states`` first copies the running runs' states here (``fetch_states``).
        """
        driver = self.actor.driver
        if self.stopped or not driver.capabilities.runs_wrapper:
            return  # no wrapper, no states (sim): and no look at a hundred thousand runs per tick
        now = time.monotonic()
        discover = now >= self._discover_at
        held = self.actor.held
        # A run's fqid and directory do not change while it runs: its handle is made once, and kept while it
        # runs (a fetch from a remote backend needs the current attempt's, made each time).
        made = {} if driver.capabilities.remote_states else self._looking
        handles: list[tuple[RunKey, RunHandle]] = []
        for job in held.jobs():  # a job without steps: only its runs that saved a state already
            which = None if discover else self.files.harvestable(job)
            candidates = held.keys(job) if which is None else [(job, i) for i in which if (job, i) in held]
            for key in candidates:
                if self.status_of(key) not in STARTED:
                    continue
                handle = made.get(key) or held.handle(key)
                if handle is not None:
                    handles.append((key, handle))
        if discover:
            self._looking = dict(handles)
            self._discover_at = now + max(DISCOVER_SECONDS, self.poll_interval, len(handles) / DISCOVER_RATE)
        if not handles:
            return
        sid = self._sid("state")
        with structlog.contextvars.bound_contextvars(stimulus_id=sid):
            if driver.capabilities.remote_states:
                await self._fetch_states([h for _, h in handles])
            reports = [RunReport(Runs(k[0], None if k[1] is None else [k[1]]), JobStatus.RUNNING, state=state)
                       for k, h in handles if (state := self.files.harvest(h)) is not None]
            if reports:
                await self.post(StatusReport(stimulus_id=sid, time=time.time(), backend=self.name,
                                             reports=tuple(reports)))

    async def _fetch_states(self, handles: list[RunHandle]) -> None:
        """The driver copies the running runs' saved states into their work dirs here; a fault is logged only
        (the states come back with the run's outputs at its end all the same)."""
        targets = [h.jobdir / "work" / STATE_DIR for h in handles]
        try:
            await self.actor.driver.fetch_states(handles, targets)
        except Exception as exc:  # the backend's fault, never the job's
            self.actor.faults.count("fetch_states")
            self.log.warning("fetching running runs' states failed", backend=self.name, error=repr(exc),
                             fqid=",".join(sorted({h.fqid for h in handles}))[:200])

    async def poll(self) -> None:
        """One tick: one status query for every run the driver holds."""
        now = time.time()
        held = self.actor.held
        polled = self.actor.polled
        if not polled or self.stopped or not self.health.may_poll(now):
            return
        self.ticks += 1
        handles = []
        for key in list(polled):
            status = self.status_of(key)
            if key not in held or status is None:  # forgotten (removed) meanwhile
                self.actor.let_go(key)
                continue
            self.actor.set_status(key, status)
            handles.append(polled[key])
        sid = self._sid()  # the tick's: every line of it, the driver's own included, carries it
        with structlog.contextvars.bound_contextvars(stimulus_id=sid):
            await self._query(handles, now, sid)

    async def _query(self, handles: list[RunHandle], now: float, sid: str) -> None:
        driver = self.actor.driver
        polled = self.actor.polled
        caps = driver.capabilities_for(handles[0].settings if handles else {})
        try:
            if caps.bulk_status:
                updates = list(await driver.status_bulk(handles))
            else:
                got = await bulk.each(handles, driver.status, stop=None, concurrency=self.concurrency)
                updates = [u for u in got if u is not None]
        except Exception as exc:  # a driver's fault is the backend's, never the job's
            self.actor.faults.count("status")
            self.log.warning("status query failed", backend=self.name, error=repr(exc), runs=len(handles),
                             fqid=",".join(sorted({str(k[0]) for k in polled})))
            lost = self.health.silent(list(polled), now, whole_backend=True)
            await self._lose(lost, f"no answer from backend {self.name} ({exc!r})")
            return
        await self.receive(updates, sid=sid, answered_all=True)
        self.last_tick = time.time() - now

    # ------------------------------------------------------------ every driver
    async def receive(self, updates: Sequence[Any], *, sid: str | None = None, answered_all: bool = False) -> None:
        """Reports from the driver (a poll's answer, or a reporting driver's own word)."""
        sid = sid or self._sid()
        with structlog.contextvars.bound_contextvars(stimulus_id=sid):
            await self._receive(updates, sid, answered_all)

    async def _receive(self, updates: Sequence[Any], sid: str, answered_all: bool) -> None:
        if not answered_all:  # a reporting driver: its runs just accepted are registered first
            async with self.actor.registering:
                pass
        with gcpause.paused():  # a report on ten thousand runs is as many short-lived objects
            await self._judge(updates, sid, answered_all)

    async def _judge(self, updates: Sequence[Any], sid: str, answered_all: bool) -> None:
        held = self.actor.held
        now = time.time()
        good: list[tuple[RunKey, StatusUpdate]] = []
        garbage: list[RunKey] = []
        for u in updates:
            if type(u) is StatusUpdate and type(u.status) is JobStatus:  # as a rule: one check of each
                key = _key(u.fqid)
                if key is not None and key in held:
                    good.append((key, u))
                    continue
            key = _key(getattr(u, "fqid", None))
            known = key is not None and key in held
            if not known or not isinstance(u, StatusUpdate) or not isinstance(u.status, JobStatus):
                self.log.warning("unintelligible status report", backend=self.name,
                                 fqid=str(getattr(u, "fqid", "?")), report=repr(u)[:200])
                if key is not None and known:
                    garbage.append(key)
                continue
            assert key is not None
            good.append((key, u))
        if len(good) < len(updates):  # an answer with nonsense in it: a poll error all the same
            self.actor.faults.count("status" if answered_all else "report")
        if answered_all:
            self.health.answered([k for k in self.actor.polled if k not in garbage])
        else:  # (a reporting driver's runs are rarely silent: no list of a million keys for nothing)
            self.health.answered([k for k, _ in good] if self.health.runs else [])
        lost = self.health.silent(garbage, now, whole_backend=False) if garbage else []
        await self._report(good, sid)
        await self._lose(lost, f"unintelligible answers from backend {self.name}")

    async def _report(self, good: list[tuple[RunKey, StatusUpdate]], sid: str) -> None:
        reports: list[RunReport] = []
        #: (job, status, exit code, reason, started, ended) -> indexes (-1: the job itself); those ended, and those
        #: going on (the times only where the driver gave them: a report of a million runs stays a few batches)
        ended: dict[tuple[int, JobStatus, int | None, str | None, float | None, float | None], list[int]] = {}
        going: dict[tuple[int, JobStatus, int | None, str | None, float | None, float | None], list[int]] = {}
        endings = [(k, u) for k, u in good if u.status in ENDINGS or u.backend_verdict is not None]
        read: dict[RunKey, Ending] = {}
        if endings:
            settings = self.actor.held.settings(endings[0][0]) or {}
            if self.actor.driver.capabilities_for(settings).runs_wrapper:
                handles = [(k, h) for k, _ in endings if (h := self.actor.held.handle(k)) is not None]
                read = await anyio.to_thread.run_sync(lambda: {k: self.files.ending(h) for k, h in handles})
        for key, u in good:
            job, idx = key
            if u.status in ENDINGS or u.backend_verdict is not None:
                ending = read.get(key)
                if ending is None and u.backend_verdict is None:
                    ended.setdefault((job, u.status, u.exit_code, u.reason, u.started, u.ended),
                                     []).append(-1 if idx is None else idx)
                    continue
                self.actor.let_go(key)
                ending = ending or Ending()
                reports.append(RunReport(Runs(job, None if idx is None else [idx]), u.status, u.exit_code, u.reason,
                                         u.backend_verdict, ending.log, ending.stderr_tail, ending.state,
                                         ending.usage, u.started, u.ended))
            else:
                going.setdefault((job, u.status, u.exit_code, u.reason, u.started, None),
                                 []).append(-1 if idx is None else idx)
        for grouped, held in ((going, True), (ended, False)):
            for (job, status, code, reason, started, stopped), idxs in grouped.items():
                if idxs != [-1]:
                    idxs.sort()  # (in order already, as a rule: a pass in C)
                runs = Runs(job) if idxs == [-1] else Runs.of(job, idxs)
                if held:
                    self.actor.set_statuses(job, runs.indexes, status)
                else:
                    self.actor.let_go_many(job, runs.indexes)
                reports.append(RunReport(runs, status, code, reason, started=started, ended=stopped))
        if reports:
            await self.post(StatusReport(stimulus_id=sid, time=time.time(), backend=self.name,
                                         reports=tuple(reports)))

    async def _lose(self, lost: list[RunKey], reason: str) -> None:
        for key in lost:  # no longer watched; kept for the kill that follows
            handle = self.actor.release(key)
            if handle is not None:
                self.actor.lost[key] = handle
        for job, idx in lost:
            sid = self._sid("lost")  # a verdict of its own: its consequences (the kill, the retry) carry its id
            with structlog.contextvars.bound_contextvars(stimulus_id=sid):
                self.log.warning("run lost: no intelligible answer", backend=self.name, reason=reason,
                                 fqid=f"{job}" if idx is None else f"{job}.{idx}")
                await self.post(RunLost(stimulus_id=sid, time=time.time(),
                                        runs=Runs(job, None if idx is None else [idx]), reason=reason))

    def _sid(self, kind: str = "poll") -> str:
        self._seq += 1
        return f"{kind}-{self.name}-{self._seq}"


def _key(fqid: object) -> RunKey | None:
    """A backend's fqid string as a run key (``"3.17"``: (3, 17); ``"3"``: (3, None)), ``None`` when it is not
    one; the common two-part form without :func:`parse_fqid_or_none`'s generality (a million reports a tick)."""
    if type(fqid) is str:
        head, dot, tail = fqid.partition(".")
        if dot and head.isdigit() and tail.isdigit() and head.isascii() and tail.isascii():
            return (int(head), int(tail))
    fq = parse_fqid_or_none(fqid)
    if fq is None:
        return None
    return (fq[0], fq[1] if len(fq) > 1 else None)
