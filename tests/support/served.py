"""``orchestrator serve`` as a real subprocess, for the tests that talk to a service.

One class for every such test: it starts the installed ``orchestrator``
command on a home, waits until ``service.json`` names the process and
``/health`` answers on the socket, and stops it by its PID (SIGTERM, then
SIGKILL if it hangs). The ``services`` fixture stops whatever a test started,
even when the test fails.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

ORCH = Path(sys.executable).parent / "orchestrator"
#: Seconds a service may take to answer its first health check.
START_TIMEOUT = 30.0
#: README ("SIGTERM"): a SIGTERMed service persists and exits 0 within this many seconds.
STOP_LIMIT = 10.0


class Service:
    """One ``orchestrator serve`` subprocess on ``home`` (``argv`` replaces the command, for odd services)."""

    def __init__(self, home: Path, *args: str, argv: list[str] | None = None) -> None:
        self.home = home
        self.args = args
        self.argv = argv
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: dict[str, Any] = {}
        home.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ life
    def launch(self) -> Service:
        """Start the process (its stdout and stderr go to ``serve-N.out``/``.err`` in the home)."""
        n = len(list(self.home.glob("serve-*.out")))
        self.out, self.err = self.home / f"serve-{n}.out", self.home / f"serve-{n}.err"
        command = self.argv if self.argv is not None else [str(ORCH), "--home", str(self.home), "serve", *self.args]
        with open(self.out, "wb") as out, open(self.err, "wb") as err:
            self.proc = subprocess.Popen(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL, cwd=self.home)
        return self

    def start(self) -> Service:
        """Launch and wait until ready. One that never gets ready is stopped by its PID before the error rises:
        callers write ``Service(...).start()`` before their ``try``, so nothing else would stop it."""
        self.launch()
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def wait_ready(self) -> Service:
        """Until ``service.json`` names this process and ``/health`` answers 200 on the socket."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc_().poll() is not None:
                raise AssertionError(f"the service exited with {self.proc_().returncode} while starting\n"
                                     f"{self.output()}")
            try:
                info = json.loads((self.home / "service" / "service.json").read_text())
            except (FileNotFoundError, ValueError):
                info = None
            if isinstance(info, dict) and info.get("pid") == self.pid:
                try:
                    with self.client() as c:
                        if c.get("/health").status_code == 200:
                            self.info = info
                            return self
                except httpx.TransportError:
                    pass
            time.sleep(0.05)
        raise AssertionError(f"the service did not answer within {START_TIMEOUT:g} s\n{self.output()}")

    def terminate(self) -> tuple[int, float]:
        """SIGTERM; the exit code and the seconds it took (SIGKILL past twice the limit)."""
        proc = self.proc_()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(2 * STOP_LIMIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"no exit {2 * STOP_LIMIT:g} s after SIGTERM\n{self.output()}") from None
        return code, time.monotonic() - t0

    def stop(self) -> int | None:
        """Teardown: end it by its PID whatever state it is in; its exit code (``None`` if never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(2 * STOP_LIMIT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    # ------------------------------------------------------------ facts
    def proc_(self) -> subprocess.Popen[bytes]:
        assert self.proc is not None, "the service was not launched"
        return self.proc

    @property
    def pid(self) -> int:
        return self.proc_().pid

    @property
    def socket(self) -> Path:
        return self.home / "service" / "api.sock"

    @property
    def port(self) -> int:
        return int(self.info["tcp_port"])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        """The token in the home's default token file (``--tcp-port`` without ``--token-file``)."""
        return (self.home / "service" / "token").read_text().strip()

    def output(self) -> str:
        return f"stdout:\n{self.out.read_text(errors='replace')}\nstderr:\n{self.err.read_text(errors='replace')}"

    # ------------------------------------------------------------ talking to it
    def client(self) -> httpx.Client:
        """A synchronous HTTP client on the Unix socket."""
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://orchestrator",
                            timeout=15.0)

    def tcp_client(self) -> httpx.AsyncClient:
        """An async HTTP client on TCP, with the home's token."""
        return httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=10)

    async def cli(self, *args: str) -> str:
        """Run ``orchestrator --home HOME ARGS...`` (it goes through this service); its stdout."""
        result = await anyio.run_process([str(ORCH), "--home", str(self.home), *args], check=False)
        if result.returncode != 0:
            raise AssertionError(f"orchestrator {' '.join(args)}: exit {result.returncode}\n"
                                 f"stdout: {result.stdout.decode()}\nstderr: {result.stderr.decode()}")
        return result.stdout.decode()


@pytest.fixture
def services() -> Iterator[list[Service]]:
    """Services started by a test, stopped by PID afterwards even if it fails."""
    started: list[Service] = []
    yield started
    for service in started:
        service.stop()


def start(services: list[Service], home: Path, *args: str, argv: list[str] | None = None) -> Service:
    """Start a service that the ``services`` fixture will stop."""
    service = Service(home, *args, argv=argv)
    services.append(service)
    return service.start()


def cli(home: Path, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ORCH), "--home", str(home), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def cli_ok(home: Path, *args: str, timeout: float = 60.0) -> str:
    result = cli(home, *args, timeout=timeout)
    assert result.returncode == 0, f"orchestrator {' '.join(args)}: exit {result.returncode}\n{result.stderr}"
    return result.stdout


#: The bearer token of the ``shared`` service.
TOKEN = secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    """One service for a test module, on TCP too, with ``TOKEN`` in its token file."""
    where = tmp_path_factory.mktemp("shared")
    token_file = where / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    service = Service(where / "home", "--tcp-port", "0", "--token-file", str(token_file))
    try:
        yield service.start()
    finally:
        service.stop()
