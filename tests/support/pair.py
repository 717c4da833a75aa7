"""Two homes on one PostgreSQL repository, standing for two hosts: the active/standby pair, for the tests.

``pair_homes`` writes each home's ``orchestrator.toml``: the repository's URL,
the shared directory both see (job workspaces, the drivers' state), the
lease. ``health`` asks a home's service what it is (``role``: ``active`` or
``standby``). ``Pair`` runs a real supervisord per home, with the project's
own ``config/supervisord.conf``, SIGKILLs whichever service is active and
measures how long until another one is. ``Following`` makes the torture's
careful calls through whichever service is active, as the CLI does: asking
a home's service, and following a standby to the active one.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import anyio
from supervised import Robust, Supervised

from orchestrator.api.client import ServiceClient, ServiceUnavailable, connect


def home_settings(url: str, shared: Path, *, lease_seconds: float = 5.0, core: str = "") -> str:
    """A home's ``orchestrator.toml`` on the shared repository ``url`` (``core``: lines of ``[core]``)."""
    return (f"[core]\n{core}\n[repository]\nurl = {url!r}\nshared_dir = {str(shared)!r}\n"
            f"lease_seconds = {lease_seconds}\n")


def pair_homes(root: Path, url: str, *, lease_seconds: float = 5.0, core: str = "") -> tuple[Path, Path, Path]:
    """Homes ``a`` and ``b`` on ``url``, sharing ``root/shared``; returns (a, b, shared)."""
    shared = root / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    homes = []
    for name in ("a", "b"):
        home = root / name
        home.mkdir(parents=True, exist_ok=True)
        (home / "orchestrator.toml").write_text(home_settings(url, shared, lease_seconds=lease_seconds, core=core))
        homes.append(home)
    return homes[0], homes[1], shared


async def health(home: Path) -> dict[str, Any] | None:
    """What the service on ``home`` says of itself, or ``None`` when none answers there now."""
    try:
        async with ServiceClient(socket=home / "service" / "api.sock") as client:
            with anyio.fail_after(5):
                answer: dict[str, Any] = await client.call("health")
                return answer
    except (ServiceUnavailable, TimeoutError):
        return None


class Pair:
    """One supervisord per home; see the module docstring."""

    def __init__(self, *homes: Path) -> None:
        self.sups = [Supervised(home) for home in homes]
        #: Seconds from each SIGKILL to another service's answering as the active one.
        self.takeovers: list[float] = []

    def start(self) -> None:
        for sup in self.sups:
            sup.start()

    def stop(self) -> None:
        for sup in self.sups:
            sup.stop()

    async def active(self, timeout: float = 60.0, not_pid: int | None = None) -> tuple[int, int]:
        """(index of the home, pid) of the service that says it is active (not ``not_pid``)."""
        with anyio.fail_after(timeout):
            while True:
                for i, sup in enumerate(self.sups):
                    seen = await health(sup.home)
                    if seen is not None and seen.get("role") == "active" and seen["pid"] != not_pid:
                        return i, int(seen["pid"])
                await anyio.sleep(0.05)

    async def kill_active(self) -> float:
        """SIGKILL the active service; the seconds until another one answers as active."""
        _, pid = await self.active()
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        await self.active(timeout=60, not_pid=pid)
        took = time.monotonic() - killed
        self.takeovers.append(took)
        return took

    async def kill_at_random(self, times: int, low: float, high: float, rng: Any,
                             first: tuple[float, float] = (0.3, 1.0)) -> None:
        """``times`` SIGKILLs of the active service, each a random while after the previous takeover."""
        await self.active()
        for n in range(times):
            await anyio.sleep(rng.uniform(*first) if n == 0 else rng.uniform(low, high))
            await self.kill_active()


class Following(Robust):
    """Robust calls through the active service, found from ``home`` (whose own service may be the standby)."""

    async def client(self) -> ServiceClient:
        try:
            found = await connect(self.home, wait=1.0)
        except ServiceUnavailable:
            found = None
        if found is None:
            raise ServiceUnavailable(f"no active service found from {self.home}")
        return found
