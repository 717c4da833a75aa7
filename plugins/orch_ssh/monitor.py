"""The ssh driver's monitoring tick and fetch-back.

``status_bulk`` runs ONE remote command per host per tick (``kill -0`` on the
running wrappers' PIDs, then the host's events file from the last offset),
fetches ended runs' output dirs (and saved states) back with SFTP before they
are reported final, and counts a silent host's time itself when other hosts
answer. ``fetch_states`` copies running runs' new states once a tick.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import anyio

from orchestrator.plugin import JobStatus, RunHandle, StatusUpdate
from orchestrator.plugin.wrapper import decimal

from . import scripts
from .host import (
    ENDED,
    KILLED,
    LAUNCHED,
    LOST,
    QUEUED,
    STARTED,
    UNVERIFIED,
    Dropped,
    Host,
    HostError,
    RemoteFailed,
    Run,
)
from .placement import STATE_DIR, SshBase, _split_id

#: Seconds a launched wrapper whose PID is gone may take to show its START line before it is lost.
_START_GRACE = 3.0
_MARK = scripts.EVENTS_MARK.encode() + b"\n"
#: The runs' CPU records in their output dirs, one per attempt (the wrapper appends them).
USAGE = "orch.usage"


class BackendFault(RuntimeError):
    """No host of a status query answered: the core treats it as the backend's fault and backs off."""


class MonitorMixin(SshBase):
    """Status queries (one remote command per host per tick), fetching outputs and states back."""

    # ----------------------------------------------------------------- status
    async def status(self, handle: RunHandle) -> StatusUpdate | None:
        updates = await self.status_bulk([handle])
        return updates[0] if updates else None

    async def status_bulk(self, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        """One remote command per host (concurrently), whatever the number of runs; ended runs fetched first."""
        self.ticks += 1
        tally: dict[str, int] = {}
        updates: list[StatusUpdate] = []
        groups: dict[Host, list[RunHandle]] = {}
        watched: dict[Host, set[str]] = {}
        for h in handles:
            try:
                host, key = self._locate(h)
            except (ValueError, KeyError) as exc:
                updates.append(StatusUpdate(h.fqid, JobStatus.FAILED, reason=f"lost: {exc}"))
                continue
            groups.setdefault(host, []).append(h)
            watched.setdefault(host, set()).add(key)
        for host in self.hosts.values():  # (runs not mentioned stay ours: their submission may not have returned)
            host.settle(watched.get(host, set()))
        errors: dict[Host, BaseException] = {}
        looked: dict[str, int] = {}
        async with anyio.create_task_group() as tg:
            for host, group in groups.items():
                extra = host.unwatched(watched[host])
                looked[host.label] = len(group) + len(extra)
                tg.start_soon(self._poll, host, group, extra, tally, updates, errors)
        self.tick_commands.append(tally)
        self.tick_runs.append(looked)
        if not errors:
            return updates
        if len(errors) == len(groups):
            raise BackendFault("; ".join(f"{h.label}: {e}" for h, e in errors.items()))
        now = time.monotonic()
        for host in errors:  # the others answered: this host's silence is counted here, per host
            since = self._silent_since.setdefault(host.label, now)
            if now - since < self.lost_after:
                continue
            reason = f"host {host.label} did not answer for {now - since:.0f} s ({errors[host]})"
            for h in groups[host]:
                entry = host.run(_split_id(h.backend_id)[0])
                entry.reason = reason
                entry.advance(LOST)
                updates.append(StatusUpdate(h.fqid, JobStatus.FAILED, reason=reason, backend_verdict="lost"))
        return updates

    async def _poll(self, host: Host, handles: list[RunHandle], extra: list[Run], tally: dict[str, int],
                    updates: list[StatusUpdate], errors: dict[Host, BaseException]) -> None:
        try:
            found = await self._poll_host(host, handles, extra, tally)
        except HostError as exc:
            errors[host] = exc
            return
        except Exception as exc:  # a surprise is still the backend's fault, and must not cancel the other hosts
            self.log.error("ssh status failed unexpectedly", host=host.label, error=repr(exc))
            errors[host] = exc
            return
        self._silent_since.pop(host.label, None)
        updates.extend(found)

    async def _poll_host(self, host: Host, handles: list[RunHandle], extra: list[Run],
                         tally: dict[str, int]) -> list[StatusUpdate]:
        """One command for the core's runs here and ``extra``, the driver's runs it does not watch (no reports)."""
        pairs = [(h, host.run(_split_id(h.backend_id)[0])) for h in handles]
        entries = [e for _, e in pairs] + extra
        pids = sorted({e.pid for e in entries if e.state in (LAUNCHED, STARTED) and e.pid})
        unverified = [e.key for e in entries if e.state == UNVERIFIED]
        script = scripts.monitor(host.base, pids, unverified, host.event_lines.offset)
        out = await host.command("monitor", script, tally, timeout=self.status_timeout)
        head, mark, events = out.partition(_MARK)
        if not mark:
            raise RemoteFailed(f"monitor on {host.label} answered without its events mark: {out[-200:]!r}")
        alive: set[int] = set()
        where: dict[str, str] = {}
        for line in head.decode(errors="replace").splitlines():
            w = line.split()
            if len(w) == 2 and w[0] == "A" and (pid := decimal(w[1])) is not None:
                alive.add(pid)
            elif len(w) == 3 and w[0] == "K":
                where[w[1]] = w[2]
        host.feed(events)
        for key, state in where.items():
            entry = host.runs.get(key)
            if entry is None or entry.state != UNVERIFIED:
                continue  # the events said more than the guard
            if state == "launched":
                entry.advance(LAUNCHED)
            elif state == "prepared":
                entry.advance(QUEUED)
                host.queue.append(entry)
                self._wake.set()
            else:
                entry.reason = f"the run never reached {host.label} (no run file there)"
                entry.advance(LOST)
        now = time.monotonic()
        checked = set(pids)
        to_fetch: list[tuple[RunHandle, Run]] = []
        freed = False
        for entry in entries:
            if entry.state == STARTED and entry.pid in checked and entry.pid not in alive:
                entry.reason = "the wrapper ended without an END line (killed or crashed)"
                entry.advance(LOST)
            elif (entry.state == LAUNCHED and entry.pid in checked and entry.pid not in alive
                  and now - entry.since > _START_GRACE):
                # (A moment's grace: were ``setsid`` to fork, the PID we know would die before START names
                # the wrapper's own.)
                entry.reason = "the wrapper exited before it started the job (see wrapper.out on the host)"
                entry.advance(LOST)
            elif entry.state == LAUNCHED and entry.pid is None and now - entry.since > self.launch_grace:
                entry.reason = f"no sign of the wrapper {self.launch_grace:.0f} s after its launch"
                entry.advance(LOST)
            freed = freed or (entry.state in (ENDED, LOST) and not entry.fetched)  # a slot came free
        for h, entry in pairs:  # (the output of a run the core does not watch yet is fetched once it does)
            if entry.state in (ENDED, LOST) and not entry.fetched:
                to_fetch.append((h, entry))
        if to_fetch:
            await self._fetch(host, to_fetch)
        if freed and host.queue:
            self._wake.set()
        return [u for h, e in pairs if (u := _update(h, e)) is not None]

    async def _fetch(self, host: Host, items: list[tuple[RunHandle, Run]]) -> None:
        """Fetch ended runs' output dirs (concurrently); the first host error is raised after all tried."""
        limiter = anyio.CapacityLimiter(self.fetch_concurrency)
        problems: list[HostError] = []

        async def one(h: RunHandle, entry: Run) -> None:
            async with limiter:
                remote = f"{host.base}/{scripts.run_dir(entry.key)}"
                try:
                    usage = h.outputdir / USAGE
                    before = usage.read_text(errors="replace") if usage.exists() else ""
                    await host.fetch(f"{remote}/output", h.outputdir)
                    if before:  # the attempts' CPU records: this attempt's fetched, the earlier ones kept
                        usage.write_text(merge_usage(before, usage.read_text(errors="replace")))
                    # The states it saved, where the core harvests them before judging the run (checkpointing).
                    await host.fetch(f"{remote}/work/{STATE_DIR}", _local_workdir(h, entry) / STATE_DIR,
                                     create=False, kind="sftp_state")
                except Dropped as exc:  # try again next tick: the run is not final before its outputs are here
                    problems.append(exc)
                    return
                except (HostError, OSError) as exc:  # one unreadable file must not hold up the host's other runs
                    self.log.warning("ssh fetch incomplete; the run is judged on what arrived", fqid=h.fqid,
                                     host=host.label, error=str(exc))
                entry.fetched = True

        async with anyio.create_task_group() as tg:
            for h, entry in items:
                tg.start_soon(one, h, entry)
        if problems:
            raise problems[0]

    async def fetch_states(self, handles: Sequence[RunHandle], targets: Sequence[Path]) -> None:
        """Copy running runs' saved states into ``targets`` (the core's checkpointing hook, once a tick).

        Only a run whose ``current`` state number changed since the last copy
        is fetched whole: one small read per running run otherwise.
        """
        limiter = anyio.CapacityLimiter(self.fetch_concurrency)

        async def one(h: RunHandle, target: Path) -> None:
            try:
                host, key = self._locate(h)
            except (ValueError, KeyError):
                return
            remote = f"{host.base}/{scripts.run_dir(key)}/work/{STATE_DIR}"
            async with limiter:
                current = await host.read_small(f"{remote}/current")
                if current is None:
                    return
                try:
                    if (target / "current").read_bytes() == current:
                        return
                except OSError:
                    pass
                await host.fetch(remote, target, create=True, kind="sftp_state")

        async with anyio.create_task_group() as tg:
            for h, target in zip(handles, targets, strict=True):
                tg.start_soon(one, h, target)


def merge_usage(before: str, fetched: str) -> str:
    """The ``orch.usage`` records kept here (earlier attempts, each run in a remote dir of its own) and those
    fetched, each attempt once: a record is its ``<attempt> ...`` line (six fields) and the lines after it."""
    def records(text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for line in text.splitlines(keepends=True):
            fields = line.split()
            if len(fields) == 6 and fields[0].isdigit():
                out.append((fields[0], line))
            elif out:
                out[-1] = (out[-1][0], out[-1][1] + line)
        return out

    known = {attempt for attempt, _ in records(before)}
    return before + "".join(text for attempt, text in records(fetched) if attempt not in known)


def _update(h: RunHandle, entry: Run) -> StatusUpdate | None:
    """The report for one run, or ``None`` when the core already knows it."""
    state = entry.state
    if state == ENDED:
        if entry.code == 0:
            update = StatusUpdate(h.fqid, JobStatus.COMPLETED, exit_code=0)
        else:
            update = StatusUpdate(h.fqid, JobStatus.FAILED, exit_code=entry.code, reason=f"exit code {entry.code}")
    elif state == LOST:
        if not entry.fetched:
            return None
        update = StatusUpdate(h.fqid, JobStatus.FAILED, reason=entry.reason)
    elif state == KILLED:
        update = StatusUpdate(h.fqid, JobStatus.KILLED, reason=entry.reason)
    elif state == STARTED:
        update = StatusUpdate(h.fqid, JobStatus.RUNNING)
    else:
        return None
    if state in (ENDED,) and not entry.fetched:
        return None  # never final before the output dir is here: the core reads orch.log from it
    return None if update.status == h.status else update


def _local_workdir(h: RunHandle, entry: Run) -> Path:
    """Where the run's states go locally: its ``RunSpec.workdir`` (after a restart, the workspace's layout)."""
    return entry.local_workdir if entry.local_workdir is not None else h.outputdir.parent / "work"
