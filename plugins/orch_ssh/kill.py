"""The ssh driver's kill path: cancel queued runs and signal running ones, one remote command per host.

Also where runs are given up without a kill: ``forget`` is the core's word that
runs are of no more interest (the user forced them to an end, or removed
them). Nothing else lets go of a run before it ends (see ``Host.settle``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

import anyio

from orchestrator.plugin import RunHandle

from . import scripts
from .host import KILLED, LAUNCHED, QUEUED, STARTED, UNVERIFIED, Dropped, Host, HostError
from .placement import SshBase


class KillMixin(SshBase):
    """Cancelling and killing runs, and forgetting them."""

    async def forget(self, handles: Sequence[RunHandle]) -> None:
        """The core gave these runs up: they hold no slot, and a queued one is never started.

        Their processes are left alone (a forced status leaves the backend alone);
        a queued run stays prepared on its host, unlaunched.
        """
        gone: dict[Host, set[str]] = {}
        for h in handles:
            try:
                host, key = self._locate(h)
            except (ValueError, KeyError):
                continue
            host.mine.pop(key, None)
            gone.setdefault(host, set()).add(key)
        for host, keys in gone.items():
            host.queue = deque(e for e in host.queue if e.key not in keys)
        self._wake.set()  # slots may have come free

    # ------------------------------------------------------------------- kill
    async def kill(self, handle: RunHandle) -> None:
        error = (await self.kill_bulk([handle]))[0]
        if error:
            raise RuntimeError(error)

    async def kill_bulk(self, handles: Sequence[RunHandle]) -> list[str | None]:
        """Cancel or signal runs: one remote command per host."""
        results: list[str | None] = [None] * len(handles)
        groups: dict[Host, list[tuple[int, str]]] = {}
        for i, h in enumerate(handles):
            try:
                host, key = self._locate(h)
            except (ValueError, KeyError) as exc:
                results[i] = str(exc)
                continue
            groups.setdefault(host, []).append((i, key))
        async with anyio.create_task_group() as tg:
            for host, items in groups.items():
                tg.start_soon(self._kill_host, host, items, results)
        return results

    async def _kill_host(self, host: Host, items: list[tuple[int, str]], results: list[str | None]) -> None:
        entries = [host.run(key) for _, key in items]
        waiting = {id(e) for e in entries if e.state == QUEUED}
        if waiting:  # out of the launch queue while the kill goes out; the guard settles any race
            host.queue = deque(e for e in host.queue if id(e) not in waiting)
            for e in entries:
                if id(e) in waiting:
                    e.state = UNVERIFIED
        targets = [(e.key, e.pid if e.state in (LAUNCHED, STARTED) else None) for e in entries]
        try:
            out = await host.command("kill", scripts.kill(host.base, targets, self.kill_grace, time.time()))
        except HostError as exc:
            for e in entries:  # not cancelled: back in the queue (after a drop, the next tick looks them up)
                if id(e) in waiting and e.state == UNVERIFIED and not isinstance(exc, Dropped):
                    e.advance(QUEUED)
                    host.queue.append(e)
            for i, _ in items:
                results[i] = f"{host.label}: {exc}"
            return
        except Exception as exc:  # reported per run; never crash the caller's task group
            for i, _ in items:
                results[i] = f"{host.label}: {exc!r}"
            return
        said: dict[str, str] = {}
        for line in out.decode(errors="replace").splitlines():
            w = line.split()
            if len(w) == 2 and w[0] in ("C", "T", "U"):
                said[w[1]] = w[0]
        for (i, key), e in zip(items, entries, strict=True):
            word = said.get(key)
            if word in ("C", "T"):
                e.reason = "cancelled before it started" if word == "C" else "killed"
                e.advance(KILLED)
                host.mine.pop(key, None)
            elif word == "U":
                results[i] = f"{host.label}: run {key} has started but its process group is not known yet; kill again"
            else:
                results[i] = f"{host.label}: no answer about run {key}"
        self._wake.set()
