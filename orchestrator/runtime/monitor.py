"""Monitoring one backend: what its driver says of the runs it holds, made into ``StatusReport`` events.

A polled driver is asked every ``poll_interval`` about the runs its actor
holds; a reporting driver calls ``context.report`` when it learns
something. Either way the answers go through the same steps:

- sense: a report for a run nobody holds, or one that is not a
  ``StatusUpdate``, is logged and counts as no answer; a backend whose query
  raises is asked again with backoff. Runs with no intelligible answer are
  reported silent (``RunsSilent``: since when, at which attempt) on every
  tick that heard nothing of them; the state machine decides when that makes
  them lost (``lost_after_seconds``), and its changes take them out of
  :class:`~.holding.Holding`'s watch, kept for their kill.
- a run's end is read where it happened: the wrapper's log of that attempt,
  the last lines of its stderr, the newest checkpoint it saved; the driver
  lets go of it, and the state machine judges it from what came with the
  report.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio
import structlog

from ..checkpoint import STATE_DIR
from ..core.events import Event, RunReport, RunsSilent, StatusReport
from ..core.ids import Runs, parse_fqid_or_none
from ..core.statuses import ENDINGS, JobStatus
from ..core.stored import MAX_TEXT, kept
from ..plugin.contract import RunHandle, StatusUpdate
from . import bulk, gcpause
from .actor import Actor
from .held import RunKey
from .holding import Silence
from .runs import Ending, RunFiles

#: Seconds between two looks for saved states at running runs of jobs that saved none yet (one ``stat`` each)...
DISCOVER_SECONDS = 5.0
#: ... and at most this many such looks per second on average: a thousand runs are looked at every 50 s (an idle
#: service's cost stays flat as runs grow; a run's states are always read when it ends, and a run that saved one
#: is looked at every tick from then on).
DISCOVER_RATE = 20.0
#: Most ended runs whose files are read on the event loop itself (more go to a worker thread, in one hop).
INLINE_ENDINGS = 2


@dataclass
class Health:
    """The backend's: its failed queries in a row, and when it is asked again (backoff)."""

    poll_interval: float
    failures: int = 0
    resume_at: float = 0.0

    def may_poll(self, now: float) -> bool:
        return now >= self.resume_at

    def answered(self) -> None:
        self.failures, self.resume_at = 0, 0.0

    def failed(self, now: float) -> None:
        self.failures += 1
        self.resume_at = now + min(self.poll_interval * 2 ** min(self.failures, 10), 30.0)  # backoff


class Monitor:
    """Watches the runs an :class:`Actor` holds; see the module docstring."""

    def __init__(self, actor: Actor, *, post: Callable[[Event], Awaitable[None]], files: RunFiles,
                 poll_interval: float, concurrency: int, log: Any) -> None:
        self.actor = actor
        #: The runs the actor holds, through their owner's calls (:class:`~.holding.Holding`).
        self.held = actor.holding
        self.post = post
        #: What a run saved while it runs, and what it left when it ended.
        self.files = files
        self.poll_interval = poll_interval
        self.health = Health(poll_interval)
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
        held = self.held
        # A run's fqid and directory do not change while it runs: its handle is made once, and kept while it
        # runs (a fetch from a remote backend needs the current attempt's, made each time).
        made = {} if driver.capabilities.remote_states else self._looking
        handles: list[tuple[RunKey, RunHandle]] = []
        for job in held.jobs():  # a job without steps: only its runs that saved a state already
            for key in held.started(job, None if discover else self.files.harvestable(job)):
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
        polled = self.held.polled()
        if not polled or self.stopped or not self.health.may_poll(now):
            return
        self.ticks += 1
        sid = self._sid()  # the tick's: every line of it, the driver's own included, carries it
        with structlog.contextvars.bound_contextvars(stimulus_id=sid):
            await self._query(polled, now, sid)

    async def _query(self, polled: list[tuple[RunKey, RunHandle]], now: float, sid: str) -> None:
        driver = self.actor.driver
        handles = [h for _, h in polled]
        caps = driver.capabilities_for(handles[0].settings)
        try:
            if caps.bulk_status:
                updates = list(await driver.status_bulk(handles))
            else:
                got = await bulk.each(handles, driver.status, stop=None, concurrency=self.concurrency)
                updates = [u for u in got if u is not None]
        except Exception as exc:  # a driver's fault is the backend's, never the job's
            self.actor.faults.count("status")
            self.log.warning("status query failed", backend=self.name, error=repr(exc), runs=len(handles),
                             fqid=",".join(sorted({str(k[0]) for k, _ in polled})))
            self.health.failed(now)
            await self._silent([k for k, _ in polled], now, f"no answer from backend {self.name} ({exc!r})")
            return
        await self.receive(updates, sid=sid, polled=[k for k, _ in polled])
        self.last_tick = time.time() - now

    # ------------------------------------------------------------ every driver
    async def receive(self, updates: Sequence[Any], *, sid: str | None = None,
                      polled: Sequence[RunKey] | None = None) -> None:
        """Reports from the driver: a poll's answer about the runs ``polled``, or a reporting driver's own word."""
        sid = sid or self._sid()
        with structlog.contextvars.bound_contextvars(stimulus_id=sid):
            if polled is None:  # a reporting driver: its runs just accepted are registered first
                await self.actor.registered()
            with gcpause.paused():  # a report on ten thousand runs is as many short-lived objects
                await self._judge(updates, sid, polled)

    async def _judge(self, updates: Sequence[Any], sid: str, polled: Sequence[RunKey] | None) -> None:
        held = self.held
        now = time.time()
        good: list[tuple[RunKey, StatusUpdate]] = []
        garbage: list[RunKey] = []
        for u in updates:
            if type(u) is StatusUpdate and type(u.status) is JobStatus and _plain(u):  # as a rule: one check of each
                key = _key(u.fqid)
                if key is not None and key in held:
                    good.append((key, u if u.reason is None or len(u.reason) <= MAX_TEXT else _cut(u)))
                    continue
            key = _key(getattr(u, "fqid", None))
            known = key is not None and key in held
            if (not known or not isinstance(u, StatusUpdate) or not isinstance(u.status, JobStatus)
                    or not _plain(u)):
                self.log.warning("unintelligible status report", backend=self.name,
                                 fqid=str(getattr(u, "fqid", "?")), report=repr(u)[:200])
                if key is not None and known:
                    garbage.append(key)
                continue
            assert key is not None
            good.append((key, u if u.reason is None or len(u.reason) <= MAX_TEXT else _cut(u)))
        if len(good) < len(updates):  # an answer with nonsense in it: a poll error all the same
            self.actor.faults.count("status" if polled is not None else "report")
        if polled is not None:
            self.health.answered()
            self.held.heard([k for k in polled if k not in garbage] if garbage else polled)
        elif self.held.statistics().silent:  # (a reporting driver's runs are rarely silent: no list for nothing)
            self.held.heard([k for k, _ in good])
        await self._report(good, sid)
        if garbage:
            await self._silent(garbage, now, f"unintelligible answers from backend {self.name}")

    async def _report(self, good: list[tuple[RunKey, StatusUpdate]], sid: str) -> None:
        reports: list[RunReport] = []
        #: (job, status, exit code, reason, started, ended) -> indexes (-1: the job itself); those ended, and those
        #: going on (the times only where the driver gave them: a report of a million runs stays a few batches)
        ended: dict[tuple[int, JobStatus, int | None, str | None, float | None, float | None], list[int]] = {}
        going: dict[tuple[int, JobStatus, int | None, str | None, float | None, float | None], list[int]] = {}
        endings = [(k, u) for k, u in good if u.status in ENDINGS or u.backend_verdict is not None]
        read: dict[RunKey, Ending] = {}
        if endings:
            settings = self.held.settings(endings[0][0]) or {}
            if self.actor.driver.capabilities_for(settings).runs_wrapper:
                handles = [(k, h) for k, _ in endings if (h := self.held.handle(k)) is not None]
                if len(handles) > INLINE_ENDINGS:
                    read = await anyio.to_thread.run_sync(lambda: {k: self.files.ending(h) for k, h in handles})
                else:  # a file or two each, read faster than a worker thread is woken
                    read = {k: self.files.ending(h) for k, h in handles}
        for key, u in good:
            job, idx = key
            if u.status in ENDINGS or u.backend_verdict is not None:
                ending = read.get(key)
                if ending is None and u.backend_verdict is None:
                    ended.setdefault((job, u.status, u.exit_code, u.reason, u.started, u.ended),
                                     []).append(-1 if idx is None else idx)
                    continue
                self.held.let_go(job, None if idx is None else [idx])
                ending = ending or Ending()
                reports.append(RunReport(Runs(job, None if idx is None else [idx]), u.status, u.exit_code, u.reason,
                                         u.backend_verdict, ending.log, ending.stderr_tail, ending.state,
                                         ending.usage, u.started, u.ended))
            else:
                going.setdefault((job, u.status, u.exit_code, u.reason, u.started, None),
                                 []).append(-1 if idx is None else idx)
        for grouped, going_on in ((going, True), (ended, False)):
            for (job, status, code, reason, started, stopped), idxs in grouped.items():
                if idxs != [-1]:
                    idxs.sort()  # (in order already, as a rule: a pass in C)
                runs = Runs(job) if idxs == [-1] else Runs.of(job, idxs)
                if not going_on:  # (one going on keeps the status the core gave it until the core moves it)
                    self.held.let_go(job, runs.indexes)
                reports.append(RunReport(runs, status, code, reason, started=started, ended=stopped))
        if reports:
            await self.post(StatusReport(stimulus_id=sid, time=time.time(), backend=self.name,
                                         reports=tuple(reports)))

    async def _silent(self, keys: list[RunKey], now: float, reason: str) -> None:
        """No intelligible answer for these runs now: reported, a job and a start of silence per event, each
        under a stimulus id of its own (what the core decides from it, a loss and its retry, carries it)."""
        groups: dict[tuple[int, float], list[Silence]] = {}
        for silence in self.held.silent(keys, now):
            groups.setdefault((silence.key[0], silence.since), []).append(silence)
        for (job, since), silences in groups.items():
            whole = silences[0].key[1] is None
            runs = Runs(job) if whole else Runs.of(job, [s.key[1] for s in silences if s.key[1] is not None])
            sid = self._sid("silent")
            with structlog.contextvars.bound_contextvars(stimulus_id=sid):
                await self.post(RunsSilent(stimulus_id=sid, time=now, backend=self.name, runs=runs,
                                           attempts=tuple(s.attempt for s in silences), since=since, reason=reason))

    def _sid(self, kind: str = "poll") -> str:
        self._seq += 1
        return f"{kind}-{self.name}-{self._seq}"


#: The widest exit code a report may carry (a 64-bit integer: what any batch system records).
_EXIT_CODES = range(-(1 << 63), 1 << 63)


def _plain(u: StatusUpdate) -> bool:
    """Whether the update's record fields are what a repository stores (text, a 64-bit exit code, times, a
    verdict's word): a driver's ``bytes`` reason or exit code of a thousand digits could not be written, and the
    writer tried again at every flush, writing nothing else meanwhile."""
    code, started, ended = u.exit_code, u.started, u.ended
    return ((u.reason is None or type(u.reason) is str)
            and (code is None or (type(code) is int and code in _EXIT_CODES))
            and (u.backend_verdict is None or type(u.backend_verdict) is str)
            and (started is None or type(started) is float or type(started) is int)
            and (ended is None or type(ended) is float or type(ended) is int))


def _cut(u: StatusUpdate) -> StatusUpdate:
    """``u`` with as much of its reason as a run's record keeps (a driver's reason of megabytes, stored thrice)."""
    return replace(u, reason=kept(u.reason or ""))


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
