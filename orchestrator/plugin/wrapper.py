"""The job wrapper's Python side: install it, write a run's file, start it, watch it, read its log.

Every backend runs ``sh wrapper.sh RUNFILE`` on the worker. The run file is
a shell fragment in which every value is quoted with :func:`shlex.quote`:
no shell string is ever built from user data without quoting. Backends that
start wrappers on this machine from a run file use :func:`spawn_wrapper` and
:func:`reap_children` (``local`` passes a run's values in the environment
instead and starts it with :mod:`.processes`); every backend that follows an events file (the
wrappers' ``ORCH_NOTIFY`` lines) shares :class:`EventLines`. A run's directories are made by :mod:`.rundirs`
(its names re-exported here).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Iterator, Mapping, Sequence
from importlib import resources
from pathlib import Path

import anyio

from ..checkpoint import STATE_DIR as STATE_DIR  # where the State API keeps a run's states (its work dir)
from ..core.runlog import RunLog as RunLog  # what read_log answers, for drivers that read logs
from ..core.runlog import parse_log
from ..core.statuses import JobStatus
from .contract import RunHandle, RunSpec, StatusUpdate
from .rundirs import FS_TOPDIR_FL as FS_TOPDIR_FL
from .rundirs import KEPT as KEPT
from .rundirs import clear_outputs as clear_outputs
from .rundirs import link_inputs as link_inputs
from .rundirs import make_run_dirs as make_run_dirs
from .rundirs import make_usual_dirs as make_usual_dirs
from .rundirs import mark_top_dir as mark_top_dir
from .rundirs import own_dir as own_dir
from .users import read_inside

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


def prepare_local(run: RunSpec, *, bindir: Path, notify: Path | None = None) -> Path:
    """Make a run's directories on this machine, link its inputs, write its run file."""
    for d in (run.outputdir, run.workdir):
        d.mkdir(parents=True, exist_ok=True)
    link_inputs(run)
    runfile = run.jobdir / RUNFILE
    runfile.write_text(render_runfile(run, bindir=str(bindir), notify=str(notify) if notify else None,
                                      boot=boot_time()))
    return runfile


def log_path(outputdir: Path, attempt: int) -> Path:
    """The wrapper's log of one attempt: ``orch.<attempt>.log`` while it runs, ``orch.log`` once read.

    Each attempt writes a file of its own, so that a late line of an earlier attempt (a run declared
    lost whose process still lived) never lands in a later attempt's log. The runtime renames the
    attempt's file ``orch.log`` once the run has ended and its log was read.
    """
    own = outputdir / f"orch.{attempt}.log"
    return own if own.exists() else outputdir / "orch.log"


#: The most of a run's log read (:func:`read_log`, and the runtime's read of an ended run's log): its last bytes,
#: where its EXIT and END lines are, and the keywords the wrapper writes at the end; of a longer log, its first
#: :data:`LOG_HEAD` bytes too (its START line). A log its program filled with gigabytes was read whole.
LOG_READ = 1 << 20
LOG_HEAD = 64 << 10


def top_dir(outputdir: Path, fqid: str) -> Path:
    """The top-level job's dir of the run ``fqid`` whose output dir this is: the dir only the orchestrator may
    replace, which reads of the run's files stay inside (a subjob's own dirs are its owner's)."""
    return outputdir.parents[fqid.count(".")]


def read_log(outputdir: Path, attempt: int = 0, *, fqid: str | None = None) -> RunLog:
    """The log of ``attempt`` of the run whose output dir this is (empty if there is none yet, or none that can be
    read). ``fqid``: the run's, for the top-level job's dir it lies in (a subjob's output dir is two levels
    below it). Read as the orchestrator reads any file a run wrote (:func:`~.users.read_inside`): never through a
    link out of the top-level job's dir, a regular file only (a FIFO the run made would keep the reader waiting
    for good), its last :data:`LOG_READ` bytes and its first :data:`LOG_HEAD` (a log of gigabytes was read
    whole, on the event loop)."""
    top = top_dir(outputdir, fqid) if fqid else outputdir.parent
    try:
        return parse_log(read_inside(log_path(outputdir, attempt), top, LOG_READ, head=LOG_HEAD)
                         .decode(errors="replace"))
    except OSError:
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


def decimal(word: str) -> int | None:
    """``word`` as an integer if it is one in ASCII digits (a ``-`` before them allowed), else ``None``: the number
    in an event (``START pid``, ``END code``). An events file is written by runs, which may write anything in it;
    ``str.isdigit`` also takes digits ``int`` refuses ('²'), and ``lstrip("-")`` takes ``--5``: a line that raised
    where a driver read it stopped the driver, and every later process that read the file again."""
    digits = word[1:] if word[:1] == "-" else word
    return int(word) if digits.isascii() and digits.isdigit() and len(digits) < 20 else None


def event_pid(word: str) -> int | None:
    """``word`` as a process id (:func:`decimal`, and above 0: ``0`` and ``-N`` name process groups to ``kill``)."""
    number = decimal(word)
    return number if number is not None and number > 0 else None


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
        #: A line over :data:`MAX_EVENT_LINE` is being skipped, up to its newline.
        self._overlong = False

    def feed(self, data: bytes) -> list[list[str]]:
        """The whole events in ``data``, the bytes of the file that follow ``offset``. A line longer than
        :data:`MAX_EVENT_LINE` is no event: it is skipped, never kept whole (a run may write what it likes in its
        events file, and a line of gigabytes without a newline, joined again at each read, hung the driver)."""
        self.offset += len(data)
        if self._overlong:
            end = data.find(b"\n")
            if end < 0:
                return []
            data, self._overlong = data[end + 1:], False
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_EVENT_LINE:
            self._partial, self._overlong = b"", True
        return [parts for raw in lines if len(raw) <= MAX_EVENT_LINE
                and len(parts := raw.decode(errors="replace").split()) >= 3]

    def skip_to(self, path: Path, size: int) -> None:
        """Go on reading ``path`` from byte ``size``, what comes before it never read (a line cut there is
        skipped up to its end)."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            cut = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
        finally:
            os.close(fd)
        self.offset, self._partial, self._overlong = size, b"", cut

    def read(self, path: Path, most: int | None = None) -> list[list[str]]:
        """The events appended to the local file at ``path`` since the last read (``most``: of at most that many
        bytes; the rest is read next time)."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return self.read_from(fd, most)
        finally:
            os.close(fd)

    def read_from(self, fd: int, most: int | None = None) -> list[list[str]]:
        """The events appended since the last read to the file open as ``fd`` (kept open by a driver that reads
        it on every run's end: one ``pread`` where opening it again took ten system calls); ``most``, as for
        :meth:`read`."""
        out: list[list[str]] = []
        left = most
        while True:
            size = _READ_CHUNK if left is None else min(_READ_CHUNK, left)
            chunk = os.pread(fd, size, self.offset)
            out += self.feed(chunk)
            if left is not None:
                left -= len(chunk)
            if len(chunk) < size or left == 0:
                return out


_READ_CHUNK = 1 << 20
#: The longest line an events file's reader takes as an event (a START or END line is some 100 bytes).
MAX_EVENT_LINE = 64 << 10


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
