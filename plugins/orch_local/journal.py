"""The ``local`` backend's two append-only files, in its state dir.

``events.log``: one line per event of a run, ``KEY WORD VALUE... TIME``.
The driver writes ``INTENT`` (a launch begins), ``LAUNCH pid`` (the wrapper
was started), ``KILL pid deadline`` (a wrapper's process group was sent
SIGTERM, its SIGKILL due at that time) and ``LOST reason``; each wrapper writes ``START pid`` and
``END code`` itself (``ORCH_NOTIFY``), and the launcher for the runs it
starts (its ``START`` before the program starts, with its own pid, as a
wrapper's: the program's is in the ``LAUNCH`` line and the run's log).
The lines the driver writes at one moment (the INTENTs of a batch, then
its LAUNCHes) go out in one write.

``submitted.log``: one line per run accepted, ``KEY JSON``, with what
starting it needs (its command, environment, directories): a run that a
process accepted but died before starting is started by the next one from
this line. The lines of the runs accepted in one tick go out in one write.

Neither file is ever rewritten, only appended to, so a process that dies
at any moment leaves them whole up to its last complete line. Both are the
orchestrator's alone (mode 0600: ``submitted.log`` holds every run's env).

Runs of another owner (a multi-user service, ``RunSpec.owner``) write their
``START`` and ``END`` lines to ``events.<owner>.log`` instead, a file of the
owner's own (mode 0600) that no other user may read or write; the driver
writes their ``INTENT`` with the owner's name, and takes from an owner's
file only the lines of that owner's runs.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec

from orchestrator.plugin import RunSpec
from orchestrator.plugin.logs import get_logger
from orchestrator.plugin.wrapper import EventLines, decimal, event_pid

log = get_logger(component="local")


@dataclass(slots=True)
class Record:
    """What ``events.log`` says of one run (one key)."""

    intent_at: float | None = None
    pid: int | None = None
    started: bool = False
    ended: bool = False
    end_code: int | None = None
    reason: str | None = None
    #: The run's owner when it is not the orchestrator's own user (from its INTENT line).
    owner: str | None = None
    #: When its wrapper, killed, is due its SIGKILL (from its KILL line): the next process sends it if this one
    #: dies first.
    kill_by: float | None = None


#: The record every run that ended with exit code 0 in this process shares (:meth:`Journal.settle`): what a later
#: look at its key needs (it began, it ended, with 0), without an object a run. It never leaves the journal:
#: :meth:`Journal.record` hands out a copy of it, the key's own to change.
COMPLETED = Record(intent_at=0.0, started=True, ended=True, end_code=0)


def _append(fd: int, lines: Iterable[str]) -> None:
    data = "".join(lines).encode()
    while data:  # one write for a tick's lines; the loop only if the kernel took part of it
        data = data[os.write(fd, data):]


class Journal:
    def __init__(self, statedir: Path) -> None:
        self.events = statedir / "events.log"
        self.submitted = statedir / "submitted.log"
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        self._events_fd = os.open(self.events, flags, 0o600)
        self._submitted_fd = os.open(self.submitted, flags, 0o600)
        for fd in (self._events_fd, self._submitted_fd):  # made by an earlier version with others' read
            os.fchmod(fd, 0o600)
        #: The events file open for reading too: it is read on each run's end, and only ever appended to.
        self._events_in = os.open(self.events, os.O_RDONLY | os.O_CLOEXEC)
        self._lines = EventLines()
        #: The owners' own events files (``events.<owner>.log``), each read on from where it was left.
        self._owner_lines: dict[str, tuple[Path, EventLines]] = {}
        self._owner_outs: dict[str, int] = {}
        for path in sorted(statedir.glob("events.*.log")):
            self._owner_lines[path.name[len("events."):-len(".log")]] = (path, EventLines())
        #: Every run the events file names, by key.
        self.records: dict[str, Record] = {}
        #: The runs a KILL line names, as the file is first read (``None`` once :meth:`take_kills` took them).
        self._killed: set[str] | None = set()
        self._unwritten: list[str] = []
        self._closed = False

    def record(self, key: str) -> Record:
        """The record of the run ``key``, its own to change: a new one if the events file has named it nowhere yet,
        a copy of :data:`COMPLETED` if it was settled."""
        rec = self.records.get(key)
        if rec is None or rec is COMPLETED:
            rec = self.records[key] = Record() if rec is None else replace(COMPLETED)
        return rec

    def settle(self, key: str) -> None:
        """The run ``key`` ended: its record, if it tells of exit code 0 and nothing more, becomes the shared
        :data:`COMPLETED`. A later look at the key (a ``lookup`` then a ``track`` of one run, after a restart)
        still finds it ended, never to start again; its owner no longer matters (no line of an owner's file is
        taken for it: :meth:`_apply`). A hundred thousand ended runs' records were some 16 MiB."""
        rec = self.records.get(key)
        if rec is not None and rec.ended and rec.end_code == 0 and rec.reason is None:
            self.records[key] = COMPLETED

    # ------------------------------------------------------------ events.log
    def write(self, events: Iterable[tuple[str, str, object]]) -> None:
        """Append ``KEY WORD DATA TIME`` lines, in one write (none once closed: the next process reads what is).
        What :meth:`accepted` noted and did not yet write goes first: a run's INTENT line says its start began,
        and a process killed after it starts the run again from ``submitted.log``."""
        if self._closed:
            return
        self.flush_accepted()
        now = f"{time.time():.3f}"
        _append(self._events_fd, (f"{key} {word} {data} {now}\n" for key, word, data in events))

    def owner_events(self, owner: str, uid: int, gid: int) -> Path:
        """``events.<owner>.log``: made (the owner's, 0600) on first need; the wrappers of ``owner`` append to it."""
        found = self._owner_lines.get(owner)
        if found is not None:
            return found[0]
        path = self.events.with_name(f"events.{owner}.log")
        statedir = os.stat(path.parent)
        if not statedir.st_mode & 0o001:  # the owner crosses this dir to append to their file (nothing is listed)
            os.chmod(path.parent, (statedir.st_mode & 0o7777) | 0o011)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            os.fchown(fd, uid, gid)
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
        self._owner_lines[owner] = (path, EventLines())
        return path

    def owner_out(self, owner: str, uid: int, gid: int) -> int:
        """An open ``wrapper.<owner>.out`` (the owner's, 0600): where ``owner``'s wrappers leave their last words
        (never in the file every other run's wrapper writes to)."""
        fd = self._owner_outs.get(owner)
        if fd is None:
            path = self.events.with_name(f"wrapper.{owner}.out")
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            os.fchown(fd, uid, gid)
            os.fchmod(fd, 0o600)
            self._owner_outs[owner] = fd
        return fd

    def read(self) -> list[tuple[str, str, Record]]:
        """The new lines of the events file (then of the owners' files), applied to :attr:`records`:
        ``(key, word, record)`` for each."""
        fresh = self._lines.read(self.events) if self._closed else self._lines.read_from(self._events_in)
        out = self._apply(fresh, None)
        for owner, (path, lines) in self._owner_lines.items():
            if not self._caught_up(owner, path, lines):
                continue
            while True:  # all of it, a part at a time: the owner may fill it with lines of no run of theirs
                offset = lines.offset
                try:
                    fresh = lines.read(path, OWNER_READ_CHUNK)
                except OSError:
                    break
                out += self._apply(fresh, owner)
                if lines.offset - offset < OWNER_READ_CHUNK:
                    break
        return out

    def _caught_up(self, owner: str, path: Path, lines: EventLines) -> bool:
        """Whether ``owner``'s file may be read on: at most :data:`OWNER_BACKLOG` ahead of its last read, else
        skipped to its end (its owner filled it: its own runs' lines since are lost); read first (at open), of its
        last :data:`OWNER_HISTORY` bytes only."""
        try:
            size = os.stat(path).st_size
        except OSError:
            return False
        limit = OWNER_BACKLOG if lines.offset else OWNER_HISTORY
        if size - lines.offset > limit:
            log.warning("an owner's events file grew past what its runs write: what it gained is not read",
                        owner=owner, skipped_bytes=size - lines.offset - (0 if lines.offset else limit))
            try:
                lines.skip_to(path, size if lines.offset else size - limit)
            except OSError:
                return False
        return True

    def _apply(self, events: list[list[str]], owner: str | None) -> list[tuple[str, str, Record]]:
        """``owner``: lines of that owner's own file, taken for that owner's runs only, START and END only."""
        out = []
        for parts in events:
            key, word, value = parts[0], parts[1], parts[2]
            rec = self.records.get(key)
            if owner is not None and (rec is None or rec.owner != owner or word not in ("START", "END")):
                continue
            if rec is None or rec is COMPLETED:  # (settled: a line after its end makes the record its own again)
                rec = self.record(key)
            if word == "INTENT":
                at = _float(parts[3]) if len(parts) > 3 else None
                rec.intent_at = time.time() if at is None else at
                rec.owner = value if value != "-" else None
            elif word in ("LAUNCH", "START"):
                if owner is None or rec.pid is None:
                    rec.pid = event_pid(value) or rec.pid
                rec.started = rec.started or word == "START"
            elif word == "END":
                rec.ended, rec.end_code = True, decimal(value)
            elif word == "LOST":
                rec.ended, rec.reason = True, " ".join(parts[2:-1])
            elif word == "KILL":  # KEY KILL PID DEADLINE TIME: the wrapper's group signalled, its SIGKILL due then
                if len(parts) < 5 or (deadline := _float(parts[3])) is None:
                    continue
                rec.kill_by, rec.pid = deadline, event_pid(value) or rec.pid
                if self._killed is not None:
                    self._killed.add(key)
            else:
                continue
            out.append((key, word, rec))
        return out

    def take_kills(self) -> list[tuple[str, Record]]:
        """The killed wrappers the events file named when first read (once: later calls give nothing): what an
        earlier process may have left running, still due its SIGKILL (those without an end; and, of any, a child
        that outlived its wrapper)."""
        keys, self._killed = self._killed or set(), None
        return [(key, self.records[key]) for key in sorted(keys)]

    # ------------------------------------------------------------ submitted.log
    def accepted(self, run: RunSpec) -> None:
        """Note what starting ``run`` needs; written with the others of this tick by :meth:`flush_accepted`."""
        data = spec_data(run)
        try:  # msgspec: a third of json's time, and runs are accepted by the hundred thousand
            text = _ENCODE(data).decode()
        except (TypeError, ValueError, msgspec.MsgspecError):  # one msgspec does not take (a lone surrogate): json's
            text = json.dumps(data, separators=(",", ":"))
        self._unwritten.append(f"{run.key} {text}\n")

    def flush_accepted(self) -> None:
        if self._unwritten and not self._closed:
            lines, self._unwritten = self._unwritten, []
            _append(self._submitted_fd, lines)

    def accepted_specs(self, keys: set[str]) -> dict[str, RunSpec]:
        """The last run accepted under each of ``keys``, as it was accepted (one pass over the file: read when a
        restart needs it)."""
        found: dict[str, bytes] = {}
        try:
            with open(self.submitted, "rb") as f:
                for line in f:
                    key, _, data = line.partition(b" ")
                    if line.endswith(b"\n") and (name := key.decode(errors="replace")) in keys:
                        found[name] = data
        except FileNotFoundError:
            return {}
        return {key: spec_from_data(json.loads(data)) for key, data in found.items()}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            for fd in (self._events_fd, self._events_in, self._submitted_fd, *self._owner_outs.values()):
                os.close(fd)


def _float(value: str) -> float | None:
    """``value`` as a finite number of seconds, else ``None``."""
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


#: The most an owner's events file may grow between two reads, once read from its start (at open): its runs'
#: START and END lines, some 100 bytes each, are far less. Past it, the owner filled it (a sparse file of
#: gigabytes, lines by the million), and what it gained is skipped, not read on the event loop for minutes.
OWNER_BACKLOG = 4 << 20
#: The most of an owner's events file read when it is first read (at open): the lines of its runs that may
#: still be going on (some 300,000 runs' lines), not years of them, nor a file its owner made sparse and huge.
OWNER_HISTORY = 64 << 20
#: The bytes of an owner's events file taken in at a time (its lines of the owner's runs applied, the rest dropped,
#: before the next part is read: a file the owner filled with other lines never sits whole in memory).
OWNER_READ_CHUNK = 16 << 20

_PATHS = ("jobdir", "inputdir", "outputdir", "workdir")
_ENCODE = msgspec.json.Encoder().encode


def spec_data(run: RunSpec) -> dict[str, Any]:
    """``run`` as JSON data (paths as strings, tuples as lists)."""
    return {"fqid": run.fqid, "index": run.index, "attempt": run.attempt, "key": run.key,
            "executable": run.executable, "args": list(run.args), "env": dict(run.env),
            "settings": dict(run.settings), "inputs": [str(p) for p in run.inputs],
            "outputfiles": list(run.outputfiles), **{k: str(getattr(run, k)) for k in _PATHS},
            "mode": run.mode, "retry_count": run.retry_count, "retry_args": list(run.retry_args), "owner": run.owner}


def spec_from_data(data: dict[str, Any]) -> RunSpec:
    return RunSpec(fqid=data["fqid"], index=data["index"], attempt=data["attempt"], key=data["key"],
                   executable=data["executable"], args=tuple(data["args"]), env=data["env"],
                   settings=data["settings"], inputs=tuple(Path(p) for p in data["inputs"]),
                   outputfiles=tuple(data["outputfiles"]), **{k: Path(data[k]) for k in _PATHS},
                   mode=data["mode"], retry_count=data["retry_count"], retry_args=tuple(data["retry_args"]),
                   owner=data.get("owner"))
