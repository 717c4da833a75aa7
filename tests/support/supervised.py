"""The service under a real supervisord, killed at random: helpers for the torture tests.

``Supervised`` starts ``supervisord -n`` with the project's own
``config/supervisord.conf`` on a home, finds the service's pid, SIGKILLs it,
waits for supervisord to bring it back, and stops everything by PID.
``Robust`` calls the control API through those restarts the way a careful
user would: reads are retried, and a change whose answer was lost is checked
before it is tried again, never blindly repeated.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
from stored import read_jobs_and_subjobs

from orchestrator.api.client import ServiceClient, ServiceUnavailable

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


class Supervised:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.proc: subprocess.Popen[bytes] | None = None
        self.kills = 0

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "ORCHESTRATOR_HOME": str(self.home), "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        self.proc = subprocess.Popen([str(BIN / "supervisord"), "-n", "-c", str(ROOT / "config" / "supervisord.conf")],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        """SIGTERM to supervisord stops the service (SIGTERM) and itself; by PID, SIGKILL if it hangs."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        pid = self.service_pid()
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)

    def service_pid(self) -> int | None:
        try:
            return int(json.loads((self.home / "service" / "service.json").read_text())["pid"])
        except (FileNotFoundError, ValueError, KeyError):
            return None

    async def ready(self, timeout: float = 60, not_pid: int | None = None) -> int:
        """Wait until a service (another than ``not_pid``) answers; its pid."""
        with anyio.fail_after(timeout):
            while True:
                pid = self.service_pid()
                if pid is not None and pid != not_pid and _alive(pid):
                    try:
                        async with ServiceClient.for_home(self.home) as client:
                            health = await client.call("health")
                        if health["pid"] == pid:
                            return pid
                    except ServiceUnavailable:
                        pass
                await anyio.sleep(0.05)

    async def kill_at_random(self, times: int, low: float, high: float, rng: random.Random,
                             first: tuple[float, float] = (0.05, 0.5)) -> None:
        """SIGKILL the service ``times`` times, each after a random delay once the new one answers
        (the first one soon, to catch the submissions under way)."""
        pid = await self.ready()
        for n in range(times):
            await anyio.sleep(rng.uniform(*first) if n == 0 else rng.uniform(low, high))
            os.kill(pid, signal.SIGKILL)
            self.kills += 1
            pid = await self.ready(not_pid=pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Robust:
    """Control calls that survive the service being killed under them."""

    def __init__(self, home: Path, deadline: float) -> None:
        self.home = home
        self.deadline = deadline

    async def client(self) -> ServiceClient:
        """A client of the service to ask (to open with ``async with``); ServiceUnavailable when none answers."""
        return ServiceClient.for_home(self.home)

    async def read(self, method: str, **kwargs: Any) -> Any:
        while True:
            try:
                async with await self.client() as client:
                    return await client.call(method, **kwargs)
            except ServiceUnavailable:
                if time.monotonic() > self.deadline:
                    raise
                await anyio.sleep(0.1)

    async def add_and_submit(self, name: str, spec: dict[str, Any]) -> str:
        """Add the job unless a job of that name exists, then submit it while it is still new."""
        while True:
            found = [j["fqid"] for j in await self.read("jobs", name=name)]
            if not found:
                try:
                    async with await self.client() as client:
                        await client.call("add", name=name, spec=spec)
                except ServiceUnavailable:
                    pass
                continue
            fqid = str(found[0])
            state = await self.read("show", fqid=fqid, subjobs=0)
            if state["status"] != "new" or state["subjobs"]:
                return fqid
            try:
                async with await self.client() as client:
                    await client.call("submit", fqid=fqid, keep_going=True)
            except ServiceUnavailable:
                await anyio.sleep(0.1)

    async def wait_final(self, fqids: list[str]) -> list[dict[str, Any]]:
        out = []
        for fqid in fqids:
            while True:
                job = await self.read("wait", fqid=fqid, timeout=1.0)
                if not job["timed_out"]:
                    out.append(job)
                    break
                if time.monotonic() > self.deadline:
                    raise TimeoutError(f"job {fqid} still {job['status']} {job['counts']}")
        return out


async def stored_subjobs(home: Path, master: str) -> list[tuple[int, str, int]]:
    """(index, status, submit_counter) of each stored subjob, read from the repository with the runtime's loader."""
    _, subjobs = await read_jobs_and_subjobs(home)
    return [(i, status, int(info["submit_counter"])) for i, (status, info) in sorted(subjobs[int(master)].items())]


def duplicates(values: list[str]) -> dict[str, int]:
    return {k: n for k, n in Counter(values).items() if n > 1}
