"""The ``local`` launcher: one long-lived process per home that starts runs and records their ends, in place of a
``sh wrapper.sh`` per run.

Started by the driver (:mod:`.hosted`) as ``python -I launcher.py`` with its listening socket as fd 3, it leaves
the driver's session and process tree at once (a second fork), so that it outlives the orchestrator, as a
wrapper does. It writes what the wrapper writes, in the same files and the same words (``wrapper.sh`` is the
reference): ``START pid host``, ``EXIT code`` and ``END code`` in ``orch.<attempt>.log``, ``START`` and ``END``
in the events file (that ``START`` before the program starts, with the launcher's own pid, as a wrapper's), the
attempt's CPU record in ``orch.usage`` (from ``wait4``'s rusage of the run), the returned files through
``orch-finish``. A run is its program itself, in a session of its own (``posix_spawn`` with ``setsid``): killing
its process group ends it and all its children. Why: a shell per run cost the machine more CPU than the program
it started (``benchmarks/README.md``, issue 26).

It serves any number of connections, each from a process of its own user (``SO_PEERCRED``), and ends once it
has neither a connection nor a run. Messages are frames (a 4-byte length, then
fields joined by NUL bytes). To the launcher:
``B name env...`` (the orchestrator's environment, named), ``M most`` (at most ``most`` runs at once; 0: no
limit), ``S key attempt outdir home bindir base argc argv... env...`` (start: the named environment, then the
run's own entries over it; past ``most`` running, it waits its turn here, first come first started), ``K key``
(stop: SIGTERM to the run's group; a run still waiting is dropped, never started), ``D key`` (a run still
waiting dropped; one started goes on).
A run ended by SIGTERM (this stop, or one from outside: a batch system's preemption) is recorded as the
wrapper's TERM trap does: the CPU record with code 143, no ``EXIT`` nor ``END``; one ended by a SIGKILL it was
not asked for, as a wrapper killed with its process group is: not at all (its run is then failed as lost,
"without an END line"). From it, to every connection: first ``R key pid...`` (the runs it has, pid 0 for one
waiting its turn), then ``L key pid`` (started; pid 0: ended before any process, its ``END`` already written) and
``E key`` (ended; its lines written; or, never started, dropped by a ``K`` or a ``D``). Why a run may wait
here: the driver sends a few runs ahead of its free slots, so that a run that ends is followed at once by the
next, without a round trip through the orchestrator's busy event loop (``benchmarks/README.md``, issue 26). Only
the standard library: it starts in milliseconds, beside no dependency.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import time
from collections import deque

#: Seconds a launcher waits for its first connection.
IDLE_FOR = 10.0
#: A shell's search path when the run's environment has none (dash's).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Returned files are moved by the wrapper's own end (``orch-finish``), in a shell started only then; its clock read
#: as the wrapper's ``orch_ts`` reads it (to the hundredth, from ``/proc/uptime`` and ``ORCH_BOOT``).
FINISH = ('orch_ts() { if [ -n "${ORCH_BOOT:-}" ] && IFS=" " read -r _up _idle < /proc/uptime; then '
          '_ts="$((ORCH_BOOT + ${_up%.*})).${_up#*.}"; else _ts=$(date +%s); fi; }; '
          'cd -P -- "$ORCH_HOME" || exit 96; _home=$PWD; . "$ORCH_BIN/orch-finish"')
_HEAD = struct.Struct(">I")
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
#: A run's stdout and stderr, opened in the run's own process (so not closed at its exec).
_OUTPUT = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
#: Signals Python ignores that a shell leaves at their defaults (and SIGCHLD, handled here).
_DEFAULTS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD)


def frame(*fields: bytes) -> bytes:
    body = b"\0".join(fields)
    return _HEAD.pack(len(body)) + body


def frames(buffer: bytearray) -> list[list[bytes]]:
    """The whole frames at the head of ``buffer`` (taken out of it), each as its fields."""
    out, at = [], 0
    while len(buffer) - at >= 4:
        (size,) = _HEAD.unpack_from(buffer, at)
        if len(buffer) - at - 4 < size:
            break
        out.append(bytes(buffer[at + 4:at + 4 + size]).split(b"\0"))
        at += 4 + size
    del buffer[:at]
    return out


def _now() -> str:
    """Now, in hundredths of a second, cut, not rounded (as the wrapper's clock is): a time written is never later
    than the moment it stands for, which the orchestrator may already have passed."""
    seconds, hundredths = divmod(int(time.time() * 100), 100)
    return f"{seconds}.{hundredths:02d}"


def _first_line(path: bytes, dir_fd: int | None = None) -> bytes:
    """The first word of a small file (a state number), ``0`` when there is none; never follows a last link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return b"0"
    try:
        words = os.read(fd, 64).split()
        return words[0] if words else b"0"
    finally:
        os.close(fd)


def _cpu(seconds: float) -> str:
    minutes, rest = divmod(seconds, 60.0)
    return f"{int(minutes)}m{rest:.6f}s"


class Run:
    """One run: its request, then its process and its log."""

    __slots__ = ("key", "attempt", "outdir", "home", "bindir", "base", "argv", "env", "pid", "log", "written", "t0",
                 "started_from", "killed", "code", "finishing", "counted")

    def __init__(self, fields: list[bytes], bases: dict[bytes, dict[bytes, bytes]]) -> None:
        self.key, self.attempt, self.outdir, self.home, self.bindir, base = fields[1:7]
        argc = int(fields[7])
        self.argv = fields[8:8 + argc]
        self.env = dict(bases.get(base, ()))  # the orchestrator's variables, then the run's own over them
        self.env.update(e.partition(b"=")[::2] for e in fields[8 + argc:] if b"=" in e)
        self.env.pop(b"PWD", None)
        self.pid = 0
        self.written = 0
        self.log = -1
        self.t0 = ""  # when it starts (it may wait its turn first)
        self.started_from = b"0"
        self.killed = False
        self.code = 0
        self.finishing = False
        #: Started: counted against the launcher's ``most``.
        self.counted = False

    def write(self, text: str) -> None:
        with contextlib.suppress(OSError):
            self.written += os.write(self.log, text.encode())


class Launcher:
    def __init__(self, listener: socket.socket, events: str) -> None:
        self.listener = listener
        self.sel = selectors.DefaultSelector()
        self.clients: dict[socket.socket, tuple[bytearray, bytearray]] = {}  # in, out
        self.runs: dict[int, Run] = {}
        self.by_key: dict[bytes, Run] = {}
        #: Killed programs' SIGKILL, due then (``K``'s grace): here, so it comes if no orchestrator is left to send it.
        self.finishes: list[tuple[float, Run]] = []
        #: Runs sent past ``most`` running, in the order they came.
        self.waiting: deque[Run] = deque()
        #: At most this many runs at once (0: no limit), and how many there are.
        self.most = 0
        self.active = 0
        #: The orchestrator's environments (``B``), by name: the last few.
        self.bases: dict[bytes, dict[bytes, bytes]] = {}
        self.host = os.uname().nodename or "-"  # (what /proc/sys/kernel/hostname says)
        self.pid = os.getpid()  # (each os.getpid() is a system call)
        self.events = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.idle_since = time.monotonic()
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.wake = r
        signal.set_wakeup_fd(w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.sel.register(r, selectors.EVENT_READ, "wake")
        listener.setblocking(False)
        self.sel.register(listener, selectors.EVENT_READ, "listen")

    # ------------------------------------------------------------ connections
    def serve(self) -> None:
        """Until it has neither a connection nor a run (or, never connected to, for :data:`IDLE_FOR`)."""
        served = False
        while True:
            busy = bool(self.clients or self.runs or self.waiting)
            served = served or busy
            if not busy and (served or time.monotonic() - self.idle_since >= IDLE_FOR):
                self._accept()  # a connection that came meanwhile keeps it
                if not self.clients:
                    return
                continue
            due = min(at for at, _ in self.finishes) if self.finishes else None  # (none, as a rule: a turn a run)
            wait = max(0.0, due - time.monotonic()) if due is not None else None if busy else IDLE_FOR
            for key, mask in self.sel.select(timeout=wait):
                if key.data == "listen":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake, 4096)
                else:
                    self._io(key.fileobj, mask)  # type: ignore[arg-type]
            self._reap()
            if self.finishes:
                self._finish_kills()
            self._fill()
            for conn, (_, outbox) in list(self.clients.items()):
                if outbox:
                    self._flush(conn)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except BlockingIOError:
                return
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            if struct.unpack("3i", creds)[1] != os.getuid():  # another user's process: never served
                conn.close()
                continue
            conn.setblocking(False)
            for other in list(self.clients):  # what the others sent first is taken first: see _drain
                self._drain(other)
            self.clients[conn] = (bytearray(), bytearray())
            self.sel.register(conn, selectors.EVENT_READ, "client")
            self._send(conn, frame(b"R", *(f for run in self.by_key.values() for f in (run.key, b"%d" % run.pid))))

    def _drain(self, conn: socket.socket) -> None:
        """Every message already in ``conn``'s buffer, taken now. A connection comes from an orchestrator that
        starts after another was killed: the dead one's last runs (``S``) may still wait in its socket. Told in
        ``R`` only once taken, they are the new one's to adopt (waiting, or started: ``L`` follows); told in no
        ``R``, they were started all the same, and the new one, finding their START with no launcher's word of
        them, judged them lost while they ran."""
        while conn in self.clients and self._io(conn, selectors.EVENT_READ):
            pass

    def _io(self, conn: socket.socket, mask: int) -> bool:
        """Whether anything was read from ``conn`` (at most 64 KiB: a read at a time)."""
        inbox, outbox = self.clients[conn]
        if mask & selectors.EVENT_WRITE:
            self._flush(conn)
        if not mask & selectors.EVENT_READ:
            return False
        try:
            data = conn.recv(1 << 16)  # not more: a mebibyte buffer costs a mmap a call
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        inbox += data
        for fields in frames(inbox):
            if fields[0] == b"S":
                run = Run(fields, self.bases)
                self.by_key[run.key] = run
                self.waiting.append(run)  # started at the end of this turn, when a slot is free (_fill)
            elif fields[0] in (b"K", b"D"):
                self._kill(fields[1], drop_only=fields[0] == b"D", grace=float(fields[2]) if len(fields) > 2 else None)
            elif fields[0] == b"M":
                self.most = int(fields[1])
            elif fields[0] == b"B":
                self.bases[fields[1]] = dict(e.partition(b"=")[::2] for e in fields[2:] if b"=" in e)
                while len(self.bases) > 8:
                    del self.bases[next(iter(self.bases))]
        if not data:
            self._drop(conn)
        return bool(data)

    def _drop(self, conn: socket.socket) -> None:
        self.sel.unregister(conn)
        del self.clients[conn]
        conn.close()

    def _broadcast(self, data: bytes) -> None:
        for conn in list(self.clients):
            self._send(conn, data)

    def _send(self, conn: socket.socket, data: bytes) -> None:
        """Queued: what a turn of the loop has to say goes out in one send a connection, at its end."""
        self.clients[conn][1].extend(data)

    def _flush(self, conn: socket.socket) -> None:
        outbox = self.clients[conn][1]
        try:
            sent = conn.send(outbox)
        except BlockingIOError:
            sent = 0
        except OSError:  # it hears no more (gone): what it sent before is read all the same, up to its end
            sent = len(outbox)
        del outbox[:sent]
        self.sel.modify(conn, selectors.EVENT_READ | (selectors.EVENT_WRITE if outbox else 0), "client")

    # ------------------------------------------------------------ runs
    def _fill(self) -> None:
        """The waiting runs, oldest first, while fewer than ``most`` run."""
        while self.waiting and (not self.most or self.active < self.most):
            self._start(self.waiting.popleft())

    def _start(self, run: Run) -> None:
        """What ``wrapper.sh`` does before the application, then the application itself."""
        run.counted = True
        self.active += 1
        run.t0 = _now()
        try:
            run.log = os.open(run.outdir + b"/orch.%s.log" % run.attempt, _CREATE | os.O_APPEND, 0o666)
        except OSError as exc:  # its output dir is gone: nothing can be recorded
            print(f"launcher: {run.key.decode(errors='replace')}: cannot write its log: {exc}", file=sys.stderr)
            self._ended(run)
            return
        with contextlib.suppress(OSError):  # its checkpoint states, when it has some
            fd = os.open(run.home + b"/.orch-state", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                run.started_from = _first_line(b"current", fd)
                with contextlib.suppress(FileNotFoundError):  # a run resumes from the last *saved* state
                    os.unlink("work", dir_fd=fd)
            finally:
                os.close(fd)
        # Its START line in the events file, before its program exists, with the launcher's own pid (as a wrapper's,
        # written before its application starts): a launcher killed once the program may run (by the program
        # itself, even: kill $PPID) leaves a run that began, failed as lost, never taken for one that never began
        # and started a second time. Its log's START, after the spawn, has the program's pid: its process group.
        with contextlib.suppress(OSError):
            os.write(self.events, b"%s START %d %s\n" % (run.key, self.pid, run.t0.encode()))
        try:
            os.chdir(run.home)
        except OSError as exc:
            run.write(f"launcher: cannot cd to {os.fsdecode(run.home)}: {exc.strerror}\n")
            self._started(run, self.pid)
            self._exited(run, 96, None)
            return
        run.env[b"PWD"] = os.getcwdb()  # as cd sets it
        problem, pid = self._spawn(run)
        if pid is None:  # as the shell does: its message on the run's stderr, 127 or 126
            with contextlib.suppress(OSError):
                fd = os.open(run.outdir + b"/stderr", os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
                os.write(fd, problem.encode())
                os.close(fd)
            self._started(run, self.pid)
            self._exited(run, 126 if "denied" in problem else 127, None)
            return
        self._started(run, pid)
        self.runs[pid] = run
        self._broadcast(frame(b"L", run.key, b"%d" % pid))

    def _started(self, run: Run, pid: int) -> None:
        """Its log's ``START``: the program's pid (its process group), or the launcher's when none started."""
        run.pid = pid
        run.write(f"{_now()} START {pid} {self.host}\n")
        if pid == self.pid:
            self._broadcast(frame(b"L", run.key, b"0"))

    def _spawn(self, run: Run) -> tuple[str, int | None]:
        """The application, found as ``sh`` finds a command (its PATH, a file without ``#!`` run by ``sh``)."""
        outs = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, run.outdir + b"/stdout", _OUTPUT, 0o666),
                (os.POSIX_SPAWN_OPEN, 2, run.outdir + b"/stderr", _OUTPUT, 0o666)]
        name = run.argv[0]
        if b"/" in name:
            places = [name]
        else:
            path = run.env.get(b"PATH")
            places = [(d or b".") + b"/" + name for d in (path if path is not None else DEFAULT_PATH.encode())
                      .split(b":")]
        denied = False
        for place in places:
            try:
                return "", os.posix_spawn(place, run.argv, run.env, file_actions=outs, setsid=True,
                                          setsigdef=_DEFAULTS, setsigmask=())
            except OSError as exc:
                if exc.errno == errno.ENOEXEC:  # a script without "#!": the shell runs it
                    with contextlib.suppress(OSError):
                        return "", os.posix_spawn("/bin/sh", [b"sh", place, *run.argv[1:]], run.env,
                                                  file_actions=outs, setsid=True,
                                                  setsigdef=_DEFAULTS, setsigmask=())
                denied = denied or exc.errno == errno.EACCES
        shown = os.fsdecode(name)
        return (f"launcher: {shown}: Permission denied\n" if denied else f"launcher: {shown}: not found\n"), None

    def _kill(self, key: bytes, *, drop_only: bool = False, grace: float | None = None) -> None:
        run = self.by_key.get(key)
        if run is not None and not run.counted:  # still waiting: it never starts
            self.waiting.remove(run)
            self._ended(run)
        elif run is not None and run.pid and run.pid != self.pid and not drop_only:
            run.killed = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.pid, signal.SIGTERM)
            if grace is not None:
                self.finishes.append((time.monotonic() + grace, run))

    def _finish_kills(self) -> None:
        """SIGKILL to the group of each killed program still running past its grace."""
        now = time.monotonic()
        for _, run in [f for f in self.finishes if f[0] <= now and self.runs.get(f[1].pid or 0) is f[1]]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.pid or 0, signal.SIGKILL)
        self.finishes = [f for f in self.finishes if f[0] > now]

    def _reap(self) -> None:
        while self.runs:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not pid:
                return
            run = self.runs.pop(pid, None)
            if run is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            if run.finishing:
                self._end(run)
            elif code == -signal.SIGKILL:  # as the wrapper, killed with its group (asked to or not): no word, and
                self._ended(run)  # no CPU record ("an attempt killed by SIGKILL leaves no record")
            else:
                # SIGTERM is a stop from outside (a kill, a batch system's preemption), as the wrapper's trap has it
                run.killed = run.killed or code == -signal.SIGTERM
                if code < 0:
                    _say_signal(run, -code, os.WCOREDUMP(status))
                self._exited(run, 128 - code if code < 0 else code, usage)  # a signal N: 128 + N, as sh says it

    def _exited(self, run: Run, code: int, usage: object) -> None:
        """The wrapper's ``orch_usage``, ``EXIT``, then the returned files and ``END`` (or, stopped by a kill, the
        CPU record only)."""
        run.code = 143 if run.killed else code
        ended_to = _first_line(run.home + b"/.orch-state/current")  # the newest state, when it stopped
        now = _now()
        record = (f"{run.attempt.decode()} {run.started_from.decode()} {ended_to.decode()} {run.t0} {now} "
                  f"{run.code}\n0m0.000000s 0m0.000000s\n{_cpu(getattr(usage, 'ru_utime', 0.0))} "
                  f"{_cpu(getattr(usage, 'ru_stime', 0.0))}\n")
        with contextlib.suppress(OSError):
            fd = os.open(run.outdir + b"/orch.usage", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
            os.write(fd, record.encode())
            os.close(fd)
        if run.killed:
            self._ended(run)
            return
        if not (returns := self._returns(run)):  # EXIT and END at once: one write (nothing is done between them)
            self._end(run, f"{now} EXIT {run.code}\n", now)
            return
        run.write(f"{now} EXIT {run.code}\n")
        env = {k: v for k, v in run.env.items() if k in (b"PATH", b"ORCH_HOME", b"ORCH_JOBLOG", b"ORCH_BOOT")}
        env.update({b"ORCH_OUTDIR": run.outdir, b"ORCH_BIN": run.bindir, b"_returns": returns})
        with contextlib.suppress(OSError):
            pid = os.posix_spawn("/bin/sh", [b"sh", b"-c", FINISH.encode()], env, setsid=True,
                                 file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)])
            run.finishing = True
            self.runs[pid] = run
            return
        self._end(run)

    @staticmethod
    def _returns(run: Run) -> bytes:
        """The ``RETURN_FILE`` lines of the run's log, one name a line (none when only the launcher wrote there)."""
        try:
            if os.fstat(run.log).st_size <= run.written:
                return b""
            with open(run.outdir + b"/orch.%s.log" % run.attempt, "rb") as f:
                found = [parts[2] for line in f if len(parts := line.rstrip(b"\n").split(b" ", 2)) == 3
                         and parts[1] == b"RETURN_FILE"]
        except OSError:
            return b""
        return b"".join(name + b"\n" for name in found)

    def _end(self, run: Run, before: str = "", now: str = "") -> None:
        now = now or _now()  # (``before``: lines of its log written in the same write)
        run.write(f"{before}{now} END {run.code}\n")
        with contextlib.suppress(OSError):
            os.write(self.events, b"%s END %d %s\n" % (run.key, run.code, now.encode()))
        self._ended(run)

    def _ended(self, run: Run) -> None:
        if run.counted:
            run.counted = False
            self.active -= 1
        if run.log >= 0:
            os.close(run.log)
            run.log = -1
        if self.by_key.get(run.key) is run:
            del self.by_key[run.key]
        self._broadcast(frame(b"E", run.key))


def _say_signal(run: Run, number: int, core: bool) -> None:
    """What ``sh`` writes on a command's stderr when a signal ended it ("Segmentation fault (core dumped)"; nothing
    for SIGINT and SIGPIPE), written there as the wrapper's shell would: a failure's reason quotes it. Opened
    without following a link or waiting on a FIFO (the program may have put either in its place)."""
    if number in (signal.SIGINT, signal.SIGPIPE):
        return
    with contextlib.suppress(OSError):
        fd = os.open(run.outdir + b"/stderr", os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.write(fd, f"{signal.strsignal(number)}{' (core dumped)' if core else ''}\n".encode())
        finally:
            os.close(fd)


def main() -> None:
    if os.fork():  # out of the driver's process tree: it outlives the orchestrator, and nobody waits for it
        os._exit(0)
    os.setsid()
    os.closerange(4, os.sysconf("SC_OPEN_MAX"))  # what the starting process left open is not the launcher's
    listener = socket.socket(fileno=3)
    os.set_inheritable(3, False)
    Launcher(listener, sys.argv[1]).serve()


if __name__ == "__main__":
    main()
