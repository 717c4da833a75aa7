"""The job wrapper's Python side: install it, write a run's file, start it, watch it, read its log.

Every backend runs ``sh wrapper.sh RUNFILE`` on the worker. The run file is
a shell fragment in which every value is quoted with :func:`shlex.quote`:
no shell string is ever built from user data without quoting. Backends that
start wrappers on this machine from a run file use :func:`spawn_wrapper` and
:func:`reap_children` (``local`` passes a run's values in the environment
instead and starts it with :mod:`.processes`); every backend that follows an events file (the
wrappers' ``ORCH_NOTIFY`` lines) shares :class:`EventLines`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import shlex
import shutil
import struct
import sys
from array import array
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path

import anyio

from ..checkpoint import STATE_DIR as STATE_DIR  # where the State API keeps a run's states (its work dir)
from ..core.runlog import RunLog as RunLog  # what read_log answers, for drivers that read logs
from ..core.runlog import parse_log
from ..core.statuses import JobStatus
from .contract import RunHandle, RunSpec, StatusUpdate
from .users import Identity, fs_as

SCRIPTS = ("wrapper.sh", "orch-log", "orch-state", "orch-finish")
RUNFILE = "run.env"


def boot_time() -> int:
    """This machine's boot time (epoch seconds), for the wrapper's fast clock."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def install_scripts(bindir: Path) -> Path:
    """Copy the wrapper and its helpers into ``bindir``; return the wrapper's path."""
    bindir.mkdir(parents=True, exist_ok=True)
    bindir.chmod(0o755)  # every run's user reads them (a multi-user service's owners too); nothing secret there
    package = resources.files("orchestrator") / "scripts"
    for name in SCRIPTS:
        target = bindir / name
        data = (package / name).read_bytes()
        if not target.exists() or target.read_bytes() != data:
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.chmod(0o755)
            tmp.replace(target)
    return bindir / "wrapper.sh"


def script_text(name: str) -> str:
    return (resources.files("orchestrator") / "scripts" / name).read_text()


def run_values(run: RunSpec, *, bindir: str, notify: str | None = None, boot: int | None = None,
               paths: dict[str, str] | None = None, inputs: Sequence[str] | None = None) -> dict[str, str]:
    """The ``ORCH_*`` values the wrapper reads for ``run``. ``paths`` overrides directories (a remote worker's),
    ``inputs`` the paths its input links in the work dir point to (where a remote worker staged them)."""
    p = paths or {}
    linked = [str(src) for src in run.inputs] if inputs is None else list(inputs)
    return {
        "ORCH_FQID": run.fqid,
        "ORCH_KEY": run.key,
        "ORCH_OUTDIR": p.get("outputdir", str(run.outputdir)),
        "ORCH_HOME": p.get("workdir", str(run.workdir)),
        "ORCH_BIN": bindir,
        "ORCH_MODE": run.mode,
        "ORCH_RETRY_COUNT": str(run.retry_count),
        "ORCH_ATTEMPT": str(run.attempt),
        "ORCH_OUTPUTFILES": "\n".join(run.outputfiles),
        # The inputs linked into the work dir (on this machine): an output pattern matching one copies it.
        "ORCH_INPUTS": "\n".join(linked) if run.outputfiles else "",
        "ORCH_NOTIFY": notify or "",
        "ORCH_BOOT": str(boot) if boot else "",
    }


def render_runfile(run: RunSpec, *, bindir: str, notify: str | None = None, boot: int | None = None,
                   paths: dict[str, str] | None = None, inputs: Sequence[str] | None = None) -> str:
    """The run file's text. ``paths`` overrides directories (a remote worker's), ``inputs`` the input files'
    paths there (see :func:`run_values`)."""
    q = shlex.quote
    values = run_values(run, bindir=bindir, notify=notify, boot=boot, paths=paths, inputs=inputs)
    lines = [f"{k}={q(v)}" for k, v in values.items()]
    for i, arg in enumerate(run.retry_args, 1):
        lines.append(f"ORCH_RETRY_ARG_{i}={q(arg)}; export ORCH_RETRY_ARG_{i}")
    for k, v in run.env.items():
        lines.append(f"{k}={q(v)}; export {k}")
    lines.append("set -- " + " ".join(q(a) for a in (run.executable, *run.args)))
    return "\n".join(lines) + "\n"


def base_environ() -> dict[str, str]:
    """This process's environment without ``ORCH_*`` variables: the base of a run's own (an outer job's values,
    when the orchestrator itself runs inside one, never leak into a run)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}


_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


def env_entry(name: str, value: str) -> bytes:
    """``name=value`` as a process's environment holds it (encoded as :func:`os.fsencode` would)."""
    return f"{name}={value}".encode(_FS_ENCODING, _FS_ERRORS)


class BaseEnviron:
    """:func:`base_environ` as encoded ``NAME=value`` entries by name, ready for a spawn, made again only when
    ``os.environ`` has changed. Runs start by the thousand; reading ``os.environ`` decodes every variable, and
    encoding them again for each spawn cost more of the orchestrator's CPU than anything else on a run's way
    (``benchmarks/README.md``, issue 26). One per driver: it owns its copy."""

    def __init__(self) -> None:
        self._seen: dict[bytes, bytes] | None = None
        self._entries: dict[str, bytes] = {}

    def entries(self) -> dict[str, bytes]:
        """The entries by name (the caller copies before it adds to them)."""
        data = getattr(os.environ, "_data", None)  # the encoded variables os.environ keeps (CPython's)
        if not isinstance(data, dict):
            return {k: env_entry(k, v) for k, v in base_environ().items()}
        if data != self._seen:
            # made from one copy: a change another thread makes meanwhile is seen at the next call, never missed
            seen: dict[bytes, bytes] = dict(data)
            self._entries = {os.fsdecode(k): k + b"=" + v for k, v in seen.items() if not k.startswith(b"ORCH_")}
            self._seen = seen
        return self._entries


def run_variables(run: RunSpec, *, bindir: str, notify: str | None = None,
                  boot: int | None = None) -> Iterator[tuple[str, str]]:
    """What a run's environment adds to the orchestrator's, in the order a run file exports it: the run's
    ``ORCH_*`` values, its retry arguments, then the user's environment (a later name overrides an earlier one)."""
    yield from run_values(run, bindir=bindir, notify=notify, boot=boot).items()
    for i, arg in enumerate(run.retry_args, 1):
        yield f"ORCH_RETRY_ARG_{i}", arg
    yield from run.env.items()


def wrapper_env_entries(run: RunSpec, base: Mapping[str, bytes], *, bindir: str, notify: str | None = None,
                        boot: int | None = None) -> list[bytes]:
    """:func:`wrapper_env` as encoded entries over ``base`` (:meth:`BaseEnviron.entries`): the same variables in
    the same order, without decoding and encoding the orchestrator's own each time."""
    env = dict(base)
    env.update((k, env_entry(k, v)) for k, v in run_variables(run, bindir=bindir, notify=notify, boot=boot))
    return list(env.values())


#: The wrapper's own values, which it takes out of the environment before it starts the application.
WRAPPER_ONLY = ("ORCH_KEY", "ORCH_OUTDIR", "ORCH_BIN", "ORCH_OUTPUTFILES", "ORCH_NOTIFY", "ORCH_INPUTS")


def application_entries(run: RunSpec, *, bindir: str, boot: int | None = None) -> list[bytes]:
    """What the wrapper adds to the orchestrator's environment for the application of ``run``, as encoded entries
    (a later one overrides an earlier one): :func:`run_variables` less :data:`WRAPPER_ONLY`, then ``ORCH_JOBLOG``,
    ``ORCH_LOG`` and ``ORCH_STATE``. For a launcher that starts the application without the wrapper's shell and
    keeps the orchestrator's own variables once (``local``). ``PWD`` is the work dir's: the starter sets it."""
    out = [env_entry(k, v) for k, v in run_variables(run, bindir=bindir, boot=boot) if k not in WRAPPER_ONLY]
    out += [env_entry("ORCH_JOBLOG", f"{run.outputdir}/orch.{run.attempt}.log"),
            env_entry("ORCH_LOG", f"{bindir}/orch-log"), env_entry("ORCH_STATE", f"{bindir}/orch-state")]
    return out


def wrapper_env(run: RunSpec, base: Mapping[str, str], *, bindir: str, notify: str | None = None,
                boot: int | None = None) -> dict[str, str]:
    """The environment of ``sh wrapper.sh --env KEY COMMAND...``: what a run file would set, without the file:
    ``base`` (see :func:`base_environ`), then :func:`run_variables`."""
    env = dict(base)
    env.update(run_variables(run, bindir=bindir, notify=notify, boot=boot))
    return env


def wrapper_argv(shell: str, wrapper: Path | str, run: RunSpec) -> list[str]:
    """``shell wrapper --env KEY COMMAND...``: the run's key is in its command line, for ``ps`` and for a
    driver that looks for its wrapper after a crash (:func:`~orchestrator.plugin.processes.find_process`)."""
    return [shell, str(wrapper), "--env", run.key, run.executable, *run.args]


#: ext2/3/4's "top of directory hierarchies" flag (``chattr +T``), and the ioctls that read and set a file's flags
#: (``_IOR('f', 1, long)``, ``_IOW('f', 2, long)``, in the generic encoding of the architectures named).
FS_TOPDIR_FL = 0x00020000
_LONG = struct.calcsize("l")
_FLAGS_IOCTLS = ((2 << 30 | _LONG << 16 | 0x6601, 1 << 30 | _LONG << 16 | 0x6602)
                 if platform.machine() in ("x86_64", "aarch64", "i386", "i686", "armv7l", "riscv64") else None)
_top_dirs: set[str] = set()


def mark_top_dir(path: Path) -> bool:
    """Tell the filesystem that ``path``'s subdirectories are unrelated (a master's subjob dirs, the workspace's job
    dirs), where it has the notion: ext2/3/4's ``chattr +T``, which makes the Orlov allocator spread them over the
    disk's block groups instead of packing them into one. On an ext4 without a journal that matters a great deal:
    a new inode is taken only after every inode deleted in the last minutes of its block group has been passed
    over, so a group that held a thousand runs just removed makes each of the next thousand runs' files cost half a
    millisecond of kernel time; spread over the groups they cost 30 microseconds (benchmarks/README.md). Best
    effort: ``False`` where the flag cannot be set (another filesystem, another owner)."""
    if _FLAGS_IOCTLS is None:
        return False
    get, put = _FLAGS_IOCTLS
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        flags = array("i", [0])
        fcntl.ioctl(fd, get, flags, True)
        if not flags[0] & FS_TOPDIR_FL:
            flags[0] |= FS_TOPDIR_FL
            fcntl.ioctl(fd, put, flags, True)
        return True
    except OSError:  # no such flags here (ENOTTY, EOPNOTSUPP), or not ours to change (EPERM)
        return False
    finally:
        os.close(fd)


def make_run_dirs(run: RunSpec, owner: Identity | None = None) -> None:
    """Make what a run needs on this machine to start, and nothing more: its job dir, its output dir (emptied
    of an earlier attempt's files) and its work dir (three ``mkdir`` calls for a first attempt), and links to
    its input files. The wrapper makes the files (``orch.<attempt>.log``, ``stdout``, ``stderr``,
    ``orch.usage``) itself, in the run's own process. The directory that holds the job dirs is marked once as
    the top of unrelated hierarchies (:func:`mark_top_dir`).

    ``owner``: the run's owner when it is not the orchestrator's own user. The subjobs' master's dir (and a
    top-level job's own dir) is made theirs first (mode 0700); then everything inside is done with the
    owner's file system ids (:func:`~.users.fs_as`), so the directories and links are theirs and a link the
    owner left in place of one (``output`` pointing elsewhere) leads nowhere the owner could not go."""
    _mark_parent(os.path.dirname(os.fspath(run.jobdir)))
    if owner is None:
        _make_dirs(run.jobdir, run.outputdir, run.workdir)
        link_inputs(run)
        return
    _own_master_dir(run, owner)
    with fs_as(owner):
        _make_dirs(run.jobdir, run.outputdir, run.workdir)
        for d in (run.jobdir, run.outputdir, run.workdir):
            own_dir(d, owner)
        link_inputs(run)


def make_usual_dirs(jobdir: str) -> None:
    """:func:`make_run_dirs` for a run of the orchestrator's own user without input files, whose directories are
    ``output`` and ``work`` in ``jobdir``: from a string, for a driver that keeps no RunSpec for a run waiting its
    turn (``local``: path objects cost more than the calls, ``benchmarks/README.md``, issue 26)."""
    _mark_parent(os.path.dirname(jobdir))
    _make_dirs(jobdir, jobdir + "/output", jobdir + "/work")


def _mark_parent(parent: str) -> None:
    if parent not in _top_dirs:
        os.makedirs(parent, exist_ok=True)
        mark_top_dir(Path(parent))
        _top_dirs.add(parent)


def _make_dirs(jobdir: str | Path, outputdir: str | Path, workdir: str | Path) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(jobdir)
    try:
        os.mkdir(outputdir)
    except FileExistsError:  # an earlier attempt's
        clear_outputs(Path(outputdir))
    with contextlib.suppress(FileExistsError):  # an earlier attempt's, or the one its checkpoint state went into
        os.mkdir(workdir)


def own_dir(path: Path, owner: Identity, mode: int = 0o700) -> None:
    """``path`` (a directory, never a link) made ``owner``'s, with ``mode``."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != (owner.uid, owner.gid):
            os.fchown(fd, owner.uid, owner.gid)
        if st.st_mode & 0o7777 != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _own_master_dir(run: RunSpec, owner: Identity) -> None:
    """The dir the run's own dirs are made in, as the owner: a subjob's master dir (``workspace/<id>``, holding
    its shared inputs), or a top-level job's own dir (made here if the job never had one). The owner's."""
    top = run.jobdir.parent if "." in run.fqid else run.jobdir
    if (top, owner.uid) in _owned_dirs:
        return
    with contextlib.suppress(FileExistsError):
        os.mkdir(top, 0o700)
    own_dir(top, owner)
    _owned_dirs.add((top, owner.uid))


_owned_dirs: set[tuple[Path, int]] = set()


def link_inputs(run: RunSpec) -> None:
    """Each input file as a link of the same name in the run's work dir (an earlier attempt's replaced)."""
    for src in run.inputs:
        link = run.workdir / src.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(src)


def prepare_local(run: RunSpec, *, bindir: Path, notify: Path | None = None) -> Path:
    """Make a run's directories on this machine, link its inputs, write its run file."""
    for d in (run.outputdir, run.workdir):
        d.mkdir(parents=True, exist_ok=True)
    link_inputs(run)
    runfile = run.jobdir / RUNFILE
    runfile.write_text(render_runfile(run, bindir=str(bindir), notify=str(notify) if notify else None,
                                      boot=boot_time()))
    return runfile


#: Files of an output dir that outlive an attempt: the CPU records of every attempt (useful and wasted CPU).
KEPT = frozenset({"orch.usage"})


def clear_outputs(outputdir: Path) -> None:
    """Empty an output dir before a new run writes into it (the attempts' CPU records stay)."""
    if outputdir.is_dir():
        for entry in outputdir.iterdir():
            if entry.name in KEPT:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def log_path(outputdir: Path, attempt: int) -> Path:
    """The wrapper's log of one attempt: ``orch.<attempt>.log`` while it runs, ``orch.log`` once read.

    Each attempt writes a file of its own, so that a late line of an earlier attempt (a run declared
    lost whose process still lived) never lands in a later attempt's log. The runtime renames the
    attempt's file ``orch.log`` once the run has ended and its log was read.
    """
    own = outputdir / f"orch.{attempt}.log"
    return own if own.exists() else outputdir / "orch.log"


def read_log(outputdir: Path, attempt: int = 0) -> RunLog:
    """The log of ``attempt`` of the run whose output dir this is (empty if there is none yet)."""
    try:
        return parse_log(log_path(outputdir, attempt).read_text(errors="replace"))
    except FileNotFoundError:
        return RunLog()


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class SpawnError(Exception):
    """The wrapper's shell could not be started; the message is ready to serve as the run's reason."""


def spawn_wrapper(shell: str, wrapper: Path, runfile: Path, prefix: Sequence[str] = ()) -> int:
    """Start ``shell wrapper RUNFILE`` on this machine, detached, and return its pid.

    The wrapper leads a session of its own (``posix_spawn(setsid=True)``), so that killing its process
    group ends the application and all its children, and so that it outlives the process that started
    it. Its stdin is ``/dev/null``; stdout and stderr go to ``wrapper.out`` next to the run file, where
    a wrapper that dies before it writes ``orch.log`` leaves its last words. The caller reaps the pid
    (:func:`reap_children`). Raises :class:`SpawnError` if the shell cannot be started; an
    unwritable ``wrapper.out`` raises its ``OSError`` as it is.
    """
    argv = [*prefix, shell, str(wrapper), str(runfile)]  # prefix: a command that runs it as its owner
    program = (shutil.which(argv[0]) or argv[0]) if prefix else shell
    out = os.open(runfile.parent / "wrapper.out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        return os.posix_spawn(
            program, argv, os.environ,
            file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                          (os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, out, 2)],
            setsid=True,
        )
    except OSError as exc:
        raise SpawnError(f"could not start the wrapper with {shell}: {exc.strerror}") from exc
    finally:
        os.close(out)


def reap_children(children: set[int]) -> set[int]:
    """Collect those of ``children`` that exited; they leave the set and are returned.

    ``WNOHANG``, so it never blocks: a driver calls it each tick instead of keeping a thread per
    child, and no exited wrapper stays a zombie. A pid that is no longer our child counts as exited.
    """
    exited = set()
    for pid in list(children):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            children.discard(pid)
            exited.add(pid)
    return exited


class EventLines:
    """The events in an append-only events file, read on from where the last read stopped.

    Wrappers (and drivers) append one line ``KEY WORD VALUE... TIME`` per event; a driver may read
    while one is half-written, so a partial last line waits for its rest. Each event comes back as
    its words; a line of fewer than three words is no event and is skipped. ``offset`` counts the
    bytes consumed, for a driver that fetches the file's new bytes itself (``tail -c +N`` remotely)
    and passes them to :meth:`feed`.
    """

    def __init__(self) -> None:
        self.offset = 0
        self._partial = b""

    def feed(self, data: bytes) -> list[list[str]]:
        """The whole events in ``data``, the bytes of the file that follow ``offset``."""
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        return [parts for parts in (raw.decode(errors="replace").split() for raw in lines) if len(parts) >= 3]

    def read(self, path: Path) -> list[list[str]]:
        """The events appended to the local file at ``path`` since the last read."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return self.read_from(fd)
        finally:
            os.close(fd)

    def read_from(self, fd: int) -> list[list[str]]:
        """The events appended since the last read to the file open as ``fd`` (kept open by a driver that reads
        it on every run's end: one ``pread`` where opening it again took ten system calls)."""
        out: list[list[str]] = []
        while True:
            chunk = os.pread(fd, _READ_CHUNK, self.offset)
            out += self.feed(chunk)
            if len(chunk) < _READ_CHUNK:
                return out


_READ_CHUNK = 1 << 20


async def prepare_runs(runs: Sequence[RunSpec], *, bindir: Path, notify: Path | None = None) -> list[Path]:
    """:func:`clear_outputs` and :func:`prepare_local` for many runs, in a worker thread (file I/O stays off
    the event loop); returns each run's run file."""

    def work() -> list[Path]:
        out = []
        for run in runs:
            clear_outputs(run.outputdir)
            out.append(prepare_local(run, bindir=bindir, notify=notify))
        return out

    return await anyio.to_thread.run_sync(work)


def status_from_log(handle: RunHandle, log: RunLog, *, alive: bool) -> StatusUpdate | None:
    """What a run's wrapper log says of it, as the answer of a polled driver's ``status``.

    Ended (an END line): ``completed`` on exit code 0, else ``failed`` (the core reads the log again to
    judge it: a RETRY or a HOLD is its business). Started and alive: ``running``. Gone without an END
    line: ``failed``, the wrapper died. Otherwise nothing new (``None``). The log's start and end times
    come with the answer (``started``, ``ended``): they, not the time of the look, are the run's times.
    """
    started, ended = log.started, log.ended
    if log.finished:
        if log.end_code == 0:
            return StatusUpdate(handle.fqid, JobStatus.COMPLETED, exit_code=0, started=started, ended=ended)
        return StatusUpdate(handle.fqid, JobStatus.FAILED, exit_code=log.end_code, reason=f"exit code {log.end_code}",
                            started=started, ended=ended)
    if not alive:
        return StatusUpdate(handle.fqid, JobStatus.FAILED, reason="the wrapper ended without an END line",
                            started=started)
    if started is not None and handle.status == JobStatus.SUBMITTED:
        return StatusUpdate(handle.fqid, JobStatus.RUNNING, started=started)
    return None
