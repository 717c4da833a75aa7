"""A real PostgreSQL server, private to a test session (or a benchmark), on a Unix socket only.

``initdb`` refuses to run as root, so as root the cluster belongs to the
``postgres`` user (Debian's package creates it) and every server command runs
through ``runuser -u postgres``; without root it runs as oneself. The
server listens on no TCP address (``listen_addresses=''``), only on a socket
in its own temporary directory, on a port of its own (the port names the
socket file), and trusts the local connections of its one role, ``orch``.
It is stopped by the postmaster's PID (SIGINT: PostgreSQL's fast shutdown),
then its directory is removed.

``PostgresServer.database()`` makes a fresh database for one test
(``CREATE DATABASE``, about 0.1 s) and returns its URL, as a home's
``[repository] url`` takes it.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

#: Debian installs each major version's programs here; the newest one present is used.
PG_ROOT = Path("/usr/lib/postgresql")
ROLE = "orch"
#: Seconds the server may take to accept connections.
START_TIMEOUT = 30.0


def pg_bin() -> Path | None:
    """The directory of ``initdb``, ``pg_ctl`` and ``postgres``, or ``None`` when PostgreSQL is not installed."""
    found = sorted((p for p in PG_ROOT.glob("*/bin") if (p / "initdb").exists()),
                   key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    return found[-1] if found else None


def postgres_unavailable() -> str | None:
    """Why no private PostgreSQL can run here, or ``None`` if it can."""
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return "asyncpg is not installed (pip install -e '.[test]')"
    if pg_bin() is None:
        return f"PostgreSQL is not installed (no {PG_ROOT}/*/bin/initdb; scripts/install-test-deps.sh installs it)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a 'postgres' user to own the cluster (initdb refuses root)"
    return None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One private cluster: ``start()``, ``database()`` per test, ``stop()``."""

    def __init__(self, *, durable: bool = False) -> None:
        bindir = pg_bin()
        assert bindir is not None, postgres_unavailable()
        self.bin = bindir
        #: ``durable=False`` (tests): no fsync, as nothing here must survive a power cut.
        self.durable = durable
        self.root = Path(tempfile.mkdtemp(prefix="orch-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.pid: int | None = None

    def _as_owner(self, *argv: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else list(argv)

    def start(self) -> PostgresServer:
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.root.chmod(0o755)
        subprocess.run(self._as_owner(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", ROLE,
                                      "--no-sync", "-E", "UTF8", "--locale", "C"),
                       check=True, capture_output=True, stdin=subprocess.DEVNULL)
        options = [f"-p {self.port}", f"-k {self.root}", "-c listen_addresses=''", "-c max_connections=200"]
        if not self.durable:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        subprocess.run(self._as_owner(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", " ".join(options),
                                      "-l", str(self.root / "log"), "-w", "-t", str(int(START_TIMEOUT)), "start"),
                       check=True, capture_output=True, stdin=subprocess.DEVNULL)
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        return self

    def stop(self) -> None:
        """Fast shutdown by the postmaster's PID (SIGKILL if it lingers), then the directory goes."""
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGINT)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    os.kill(self.pid, 0)
                    time.sleep(0.05)
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.pid = None
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        """A URL asyncpg (and a home's ``[repository] url``) takes: the socket directory as ``host``."""
        return f"postgresql://{ROLE}@/{database}?host={self.root}&port={self.port}"

    def log(self) -> str:
        try:
            return (self.root / "log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    async def create_database(self, name: str | None = None) -> str:
        """A new empty database; its URL."""
        import asyncpg  # the test extra's; imported here so that the suite loads without it

        name = name or f"t_{secrets.token_hex(6)}"
        conn = await asyncpg.connect(self.url())
        try:
            # a file copy of the (empty) template1 is the fastest way here: 0.1 s, against 0.2-0.3 s
            await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template1 STRATEGY FILE_COPY')
        finally:
            await conn.close()
        return self.url(name)

    def database(self, name: str | None = None) -> str:
        """:meth:`create_database` outside an event loop."""
        return anyio.run(self.create_database, name)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One private PostgreSQL for the whole session (started on first use); skips when it cannot run."""
    why = postgres_unavailable()
    if why is not None:
        pytest.skip(why)
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> str:
    """A fresh database of the session's server, for one test."""
    return postgres_server.database()
