"""A real OpenSSH ``sshd`` on 127.0.0.1, private to a test (or a benchmark).

Why a real sshd and not only asyncssh's in-process server: the ``ssh``
backend's promises (runs outlive the connection, ``setsid``, process groups,
``internal-sftp``, host-key checking) are about what OpenSSH and a POSIX
shell really do. Nothing here touches the system's sshd configuration: each
:class:`Sshd` has its own config, host key, ``authorized_keys`` and PID
file, and listens on a free loopback port.

As root, logins go to a dedicated user (``orchssh``, created once with
``useradd`` and ``/bin/sh`` as its shell) because root's login shell here runs
pyenv's rc on every command (~130 ms each). Without root, the current user
logs in to an sshd it runs itself. :func:`sshd_unavailable` says why a test
must skip (only when sshd truly cannot run).

:meth:`Sshd.stop` ends the listener *and* the per-connection ``sshd``
processes it forked (by PID, walking ``/proc``), which is what a host going
away looks like to a client; the jobs' wrappers, started with ``setsid`` in
their own sessions, keep running, as they would on a real host whose sshd
restarts.

:class:`DelayProxy` forwards a loopback port to an sshd, holding each new
connection a few seconds first: a host that answers late, while the others
answer at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

SSHD = "/usr/sbin/sshd"
TEST_USER = "orchssh"
TEST_USER_HOME = Path("/tmp/orchssh-home")


def sshd_unavailable() -> str | None:
    """Why no private sshd can run here, or ``None`` if it can."""
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not installed (scripts/install-test-deps.sh installs openssh-server)"
    if not shutil.which("ssh-keygen") and not hasattr(asyncssh, "generate_private_key"):
        return "no way to generate keys"
    return None


def login_user() -> str:
    """The user tests log in as: ``orchssh`` (created if needed) as root, else oneself."""
    if os.geteuid() != 0:
        return getpass.getuser()
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        # Password "*": no password login, but not "locked" ("!"), which sshd refuses without PAM.
        subprocess.run(["useradd", "--system", "--shell", "/bin/sh", "--home-dir", str(TEST_USER_HOME),
                        "--no-create-home", "--password", "*", TEST_USER], check=True, capture_output=True)
    if _locked(TEST_USER):
        subprocess.run(["usermod", "--password", "*", TEST_USER], check=True, capture_output=True)
    entry = pwd.getpwnam(TEST_USER)
    TEST_USER_HOME.mkdir(mode=0o755, exist_ok=True)
    os.chown(TEST_USER_HOME, entry.pw_uid, entry.pw_gid)
    return TEST_USER


def allow_login(user: str) -> None:
    """Let ``user`` log in with a key: sshd (without PAM) refuses a locked account ("!"), as ``useradd`` makes one."""
    if _locked(user):
        subprocess.run(["usermod", "--password", "*", user], check=True, capture_output=True)


def _locked(user: str) -> bool:
    try:
        for line in Path("/etc/shadow").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name == user:
                return rest.startswith("!")
    except OSError:
        pass
    return False


def shared_dir(prefix: str) -> Path:
    """A fresh directory in /tmp that the login user may write (the remote side's files)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    if os.geteuid() == 0:
        entry = pwd.getpwnam(login_user())
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_key(path: Path) -> asyncssh.SSHKey:
    """A new ed25519 key pair at ``path`` (private, 0600) and ``path.pub``."""
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(path))
    path.chmod(0o600)
    key.write_public_key(str(path) + ".pub")
    return key


@dataclass
class Sshd:
    """One private sshd; ``start()``, ``stop()`` and ``start()`` again on the same port and host key."""

    root: Path
    client_key: Path
    user: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # sshd reads authorized_keys as the login user
        self.host_key_path = self.root / "host_ed25519"
        if not self.host_key_path.exists():
            self.host_key = write_key(self.host_key_path)
        else:
            self.host_key = asyncssh.read_private_key(str(self.host_key_path))
        self.authorized = self.root / "authorized_keys"
        self.authorized.write_bytes(asyncssh.read_private_key(str(self.client_key)).export_public_key())
        self.authorized.chmod(0o644)
        self.pidfile = self.root / "sshd.pid"
        self.logfile = self.root / "sshd.log"
        self.config = self.root / "sshd_config"
        self.config.write_text("\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {self.host_key_path}",
            f"AuthorizedKeysFile {self.authorized} .ssh/authorized_keys",  # and users' own (owners)
            f"PidFile {self.pidfile}", "UsePAM no", "StrictModes no",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
            "PermitRootLogin prohibit-password", "Subsystem sftp internal-sftp", "MaxSessions 64",
            "MaxStartups 100:30:200", "LogLevel ERROR", "",
        ]))

    @property
    def label(self) -> str:
        """``user@127.0.0.1:port``, as the ``ssh`` backend's ``hosts`` setting takes it."""
        return f"{self.user}@127.0.0.1:{self.port}"

    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_key.export_public_key().decode().strip()}\n"

    def start(self, timeout: float = 10.0) -> None:
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        self.proc = subprocess.Popen([SSHD, "-D", "-f", str(self.config), "-E", str(self.logfile)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.proc.returncode}: {self._log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd did not listen on {self.port}: {self._log_tail()}") from None
                time.sleep(0.02)

    def _log_tail(self) -> str:
        try:
            return self.logfile.read_text()[-2000:]
        except OSError:
            return ""

    def session_pids(self) -> list[int]:
        """PIDs of the per-connection sshd processes this sshd forked (children and grandchildren)."""
        if self.proc is None:
            return []
        parents = {self.proc.pid}
        found: list[int] = []
        for _ in range(3):  # listener -> [priv] -> user@notty
            children = []
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                name = stat[stat.index("(") + 1:stat.rindex(")")]
                ppid = int(stat[stat.rindex(")") + 2:].split()[1])
                if ppid in parents and name.startswith("sshd"):
                    children.append(int(entry.name))
            found += children
            parents = set(children)
        return found

    def stop(self) -> None:
        """End the listener and every connection it serves (not the jobs' setsid'd wrappers)."""
        if self.proc is None:
            return
        sessions = self.session_pids()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in sessions:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class SshEnv:
    """What a test needs: running sshds, the client key, known_hosts and a remote work dir."""

    sshds: list[Sshd]
    client_key: Path
    known_hosts: Path
    workdir: Path
    user: str
    base: Path

    @property
    def hosts(self) -> list[str]:
        return [s.label for s in self.sshds]

    def settings(self, **extra: object) -> dict[str, object]:
        out: dict[str, object] = {"hosts": self.hosts, "key": str(self.client_key), "workdir": str(self.workdir),
                                  "known_hosts": str(self.known_hosts)}
        out.update(extra)
        return out

    def cleanup(self) -> None:
        for s in self.sshds:
            s.cleanup()
        shutil.rmtree(self.base, ignore_errors=True)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_env(n_hosts: int = 1) -> SshEnv:
    """Start ``n_hosts`` sshds (one port each, same machine) with a fresh client key and known_hosts."""
    user = login_user()
    base = Path(tempfile.mkdtemp(prefix="orch-sshd-", dir="/tmp"))
    base.chmod(0o755)
    client_key = base / "client_ed25519"
    write_key(client_key)
    sshds: list[Sshd] = []
    try:
        for i in range(n_hosts):
            sshd = Sshd(base / f"sshd{i}", client_key, user)
            sshd.start()
            sshds.append(sshd)
    except BaseException:
        for s in sshds:
            s.cleanup()
        shutil.rmtree(base, ignore_errors=True)
        raise
    known_hosts = base / "known_hosts"
    known_hosts.write_text("".join(s.known_hosts_line() for s in sshds))
    workdir = shared_dir("orch-ssh-work-")
    env = SshEnv(sshds, client_key, known_hosts, workdir, user, base)
    return env


def env_or_skip(n_hosts: int = 1) -> SshEnv:
    """``n_hosts`` private sshds; skip the test (saying why) only when sshd cannot be installed or started here."""
    import pytest

    why = sshd_unavailable()
    if why is not None:
        pytest.skip(why)
    try:
        return start_env(n_hosts)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot start a private sshd: {exc}")


class DelayProxy:
    """A TCP forwarder on loopback that holds each new connection ``delay`` seconds before any byte passes.

    A host whose connection answers late, for tests where one host's submission must still be waiting
    while another's is done (``ssh`` backend). It runs its own asyncio loop in a thread, so the delay
    does not depend on the test's event loop. ``label(user)`` is the ``hosts`` entry that reaches the
    target through it; ``known_hosts_line(sshd)`` trusts the target's key under the proxy's port.
    """

    def __init__(self, target_port: int, delay: float = 3.0) -> None:
        self.target_port = target_port
        self.delay = delay
        self.port = 0
        self.connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> DelayProxy:
        ready = threading.Event()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = int(server.sockets[0].getsockname()[1])
            ready.set()
            await self._stop.wait()
            server.close()  # (asyncio.run then cancels the connections still piping)

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), name="delay-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the delaying proxy did not start")
        return self

    def label(self, user: str) -> str:
        """The ``hosts`` entry that reaches the target sshd through this proxy."""
        return f"{user}@127.0.0.1:{self.port}"

    def known_hosts_line(self, sshd: Sshd) -> str:
        return f"[127.0.0.1]:{self.port} {sshd.host_key.export_public_key().decode().strip()}\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await asyncio.sleep(self.delay)  # the client's first bytes wait here, and the server's banner too
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def stop(self) -> None:
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is None or stop is None or thread is None:
            return
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=5)
        self._loop = self._thread = None
