"""A real one-node Slurm cluster on loopback, private to a test session (or a benchmark).

Why a real Slurm and not a fake ``sbatch``: the ``slurm`` backend's promises
(one ``sbatch --array`` per master, ``scancel JOBID_TASK`` cancels one task,
what ``squeue`` and ``sacct -c`` say about ended, timed-out and cancelled
jobs) are about what Slurm really does. Nothing here installs anything
(``scripts/install-test-deps.sh`` does) or touches the system's Slurm or
munge configuration: :func:`start_cluster` writes a private munge key and
``slurm.conf`` under a temporary directory, starts ``munged``, ``slurmctld``
and ``slurmd`` with ``SLURM_CONF`` pointing at it, waits for the node to be
idle, and :meth:`SlurmCluster.stop` ends each daemon by its PID.

The conf is a minimal one-node cluster (``localhost``, cons_tres, job completions to a file), plus
free loopback ports of its own for slurmctld and slurmd (another cluster on
this machine, another test session's or the system's, is never met),
``KillWait=1`` so that a job over its time limit is gone a second after its
SIGTERM instead of thirty, and ``MinJobAge`` kept at its default so ended
jobs stay visible to ``squeue`` and ``scontrol`` for five minutes.
:func:`slurm_unavailable` says why a test must skip (only when Slurm truly
cannot run here: not installed, or not root).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")
CLIENTS = ("sbatch", "squeue", "scontrol", "sacct", "scancel", "sinfo", "mungekey")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slurm_unavailable() -> str | None:
    """Why no private Slurm can run here, or ``None`` if it can."""
    for path in DAEMONS:
        if not os.access(path, os.X_OK):
            return (f"{path} is not installed (scripts/install-test-deps.sh installs slurmctld slurmd "
                    "slurm-client munge, as root)")
    for name in CLIENTS:
        if shutil.which(name) is None:
            return f"{name} is not installed (scripts/install-test-deps.sh installs slurm-client and munge)"
    if os.geteuid() != 0:
        return "a private slurmd must run as root (it starts jobs as their users), and this is not root"
    return None


@dataclass
class SlurmCluster:
    """One munged, one slurmctld and one slurmd (node ``localhost``, 2 CPUs), each known by its PID."""

    root: Path
    cpus: int = 2
    extra_conf: tuple[str, ...] = ()
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: Private ports, so that this cluster never meets another one (or the system's) on 6817/6818.
    ctld_port: int = field(default_factory=lambda: free_port())
    slurmd_port: int = field(default_factory=lambda: free_port())

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self.munge_dir = self.root / "munge"
        self.munge_dir.mkdir(mode=0o755, exist_ok=True)
        self.munge_dir.chmod(0o755)  # munged refuses a socket dir others may write, clients need to reach it
        self.munge_key = self.munge_dir / "munge.key"
        self.munge_socket = self.munge_dir / "munge.socket"
        for sub in ("state", "spool", "log"):
            (self.root / sub).mkdir(exist_ok=True)
        self.jobcomp = self.root / "log" / "jobcomp.txt"
        self.conf = self.root / "slurm.conf"
        self.conf.write_text(self.conf_text())

    def conf_text(self) -> str:
        r = self.root
        lines = [
            "ClusterName=orchtest",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            # Memory enforced without cgroups: the job accounting poller kills a step over its --mem
            # (OUT_OF_MEMORY), once a second; every job gets 100 MB per CPU unless it asks for more.
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherParams=OverMemoryKill",
            "JobAcctGatherFrequency=task=1",
            "DefMemPerCPU=100",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.jobcomp}",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "ReturnToService=2",
            "SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1",
            "KillWait=1",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            *self.extra_conf,
            f"NodeName=localhost CPUs={self.cpus} RealMemory=4000 State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    @property
    def env(self) -> dict[str, str]:
        """The environment for Slurm commands against this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - kept open by the child
        try:
            self.procs[name] = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def start(self, timeout: float = 30.0) -> None:
        subprocess.run(["mungekey", "-c", "-f", "-k", str(self.munge_key)], check=True, capture_output=True)
        self.munge_key.chmod(0o400)
        self._spawn("munged", ["/usr/sbin/munged", "-F", "--force", f"--key-file={self.munge_key}",
                               f"--socket={self.munge_socket}", f"--pid-file={self.munge_dir / 'munged.pid'}",
                               f"--log-file={self.munge_dir / 'munged.log'}",
                               f"--seed-file={self.munge_dir / 'munged.seed'}"])
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged did not create its socket")
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._spawn("slurmd", ["/usr/sbin/slurmd", "-D", "-N", "localhost", "-f", str(self.conf)])
        self._wait(self._node_idle, timeout, "the node did not become idle")

    def stop_controller(self) -> None:
        """End slurmctld alone (by its PID): the cluster is unreachable, its jobs go on under slurmd."""
        proc = self.procs.pop("slurmctld")
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def start_controller(self, timeout: float = 30.0) -> None:
        """Start slurmctld again, from its saved state; return once it answers."""
        self._spawn("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(self._controller_up, timeout, "slurmctld did not answer after its restart")

    def _controller_up(self) -> bool:
        out = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True)
        return out.returncode == 0

    def _node_idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=self.env, capture_output=True, text=True)
        return out.returncode == 0 and out.stdout.strip() == "idle"

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(dead)} exited" if dead else f"timed out after {timeout:.0f} s"
                raise RuntimeError(f"{what} ({why}): {self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")) + [self.munge_dir / "munged.log"]:
            with contextlib.suppress(OSError):
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Cancel what still runs, then end slurmd, slurmctld and munged, each by its PID (TERM, then KILL)."""
        if "slurmctld" in self.procs:
            self._cancel_all()
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.pop(name, None)
            if proc is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._reap_jobs()

    def _cancel_all(self) -> None:
        """Every job of this private controller (and of no other), so no job outlives the cluster."""
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["scancel", "--user", str(os.geteuid())], env=self.env, capture_output=True, timeout=10)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                out = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True,
                                     timeout=10)
                if out.returncode != 0 or not out.stdout.strip():
                    break
                time.sleep(0.2)

    def _reap_jobs(self) -> None:
        """Kill what slurmd left behind (``slurmstepd`` and job processes, which carry our ``SLURM_CONF``), by PID."""
        mark = f"SLURM_CONF={self.conf}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                env = (entry / "environ").read_bytes()
            except OSError:
                continue
            if mark in env.split(b"\0"):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry.name), signal.SIGKILL)

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster(cpus: int = 2, extra_conf: tuple[str, ...] = ()) -> SlurmCluster:
    """A started private cluster; the caller ``cleanup()``s it."""
    root = Path(tempfile.mkdtemp(prefix="orch-slurm-", dir="/tmp"))
    root.chmod(0o755)  # other users submit too (jobs run as their owners): they read slurm.conf
    cluster = SlurmCluster(root, cpus=cpus, extra_conf=extra_conf)
    try:
        cluster.start()
    except BaseException:
        cluster.cleanup()
        raise
    return cluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """One private cluster for the whole session; skips (saying why) only when Slurm cannot run here."""
    why = slurm_unavailable()
    if why is not None:
        pytest.skip(why)
    try:
        cluster = start_cluster()
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot start a private Slurm cluster: {exc}")
    yield cluster
    cluster.cleanup()
