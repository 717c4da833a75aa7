"""A WMS service process for tests: start it on a free loopback port, kill or restart it by PID.

Why a real subprocess and not an in-process server: the faults worth testing
are those of a separate service: it can be killed with SIGKILL mid-run and
restarted on the same port and state, and the driver must notice nothing
but a few failed calls.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import anyio

from .wms import active_pids


class WMSProcess:
    """``python -m orch_glite serve`` as a child of the test process, known by its PID."""

    def __init__(self, statedir: Path, *, port: int = 0, max_running: int = 64,
                 faults: Mapping[str, Any] | None = None, launch_grace: float = 5.0, kill_grace: float = 1.0) -> None:
        self.statedir = statedir
        self.port = port
        self.max_running = max_running
        self.faults = dict(faults or {})
        self.launch_grace = launch_grace
        self.kill_grace = kill_grace
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        #: Every PID this object started, in order (a restart adds one).
        self.pids: list[int] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def logfile(self) -> Path:
        return self.statedir.parent / f"{self.statedir.name}.log"

    def _spawn(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"the WMS is already running (pid {self.proc.pid})")
        self.statedir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (self.statedir / "endpoint").unlink()
        args = [sys.executable, "-m", "orch_glite", "serve", "--listen", f"127.0.0.1:{self.port}",
                "--state", str(self.statedir), "--max-running", str(self.max_running),
                "--launch-grace", str(self.launch_grace), "--kill-grace", str(self.kill_grace)]
        if self.faults:
            args += ["--faults", json.dumps(self.faults)]
        self._log = open(self.logfile, "ab")  # noqa: SIM115 - kept open for the child's lifetime
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        self.pids.append(self.proc.pid)

    def _ready(self) -> bool:
        """True once the service listens; raises if it died first."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"the WMS exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
        try:
            endpoint = (self.statedir / "endpoint").read_text().strip()
        except FileNotFoundError:
            return False
        if not endpoint:
            return False
        self.port = int(endpoint.rsplit(":", 1)[1])  # a restart reuses this port
        return True

    def start(self, timeout: float = 20.0) -> WMSProcess:
        """Start and wait until it listens (blocking: for fixtures)."""
        self._spawn()
        deadline = time.monotonic() + timeout
        while not self._ready():
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the WMS did not listen within {timeout} s:\n{self.log_text()[-3000:]}")
            time.sleep(0.02)
        return self

    async def astart(self, timeout: float = 20.0) -> WMSProcess:
        """Start and wait until it listens, without blocking the event loop (for use mid-test)."""
        self._spawn()
        with anyio.fail_after(timeout):
            while not self._ready():
                await anyio.sleep(0.02)
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the service's PID and reap it (its nodes keep running)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, sig)
        self.proc.wait(timeout=30)
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM by PID, then SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
        self.kill()  # closes the log

    def kill_nodes(self) -> None:
        """End the process group of every node the service left running (a test's clean-up)."""
        for pid in active_pids(self.statedir):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def log_text(self) -> str:
        try:
            return self.logfile.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_events(self) -> list[dict[str, Any]]:
        """The service's JSON log lines."""
        out = []
        for line in self.log_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out
