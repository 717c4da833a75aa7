"""The State API for a job's own code: DataGrid's trivial checkpointing, in Python.

A job saves its state (``<var, value>`` pairs plus its position in its
steps) from time to time; after a crash the orchestrator restores the last
saved state in the job's working directory and the job carries on from
there::

    from orchestrator.checkpoint import State      # or copy this file next to the job: `from checkpoint import State`

    state = State()                                # the last saved state (or the initial one)
    total = state.get_int_value("collision") or 0
    while (step := state.get_next_step()) is not None:
        total += collisions(int(step))
        state.save_value("collision", total)
        state.save_state()
    state.set_final_state()
    state.save_state()

This module runs on workers, so it imports the standard library only (no
other module of the package) and works as a lone file.

On-disk format, shared by this module, the shell helper ``$ORCH_STATE``,
the repository and ``orchestrator checkpoint get``: the job's states live in
``$ORCH_HOME/.orch-state/``, one file ``<seq>.state`` per saved state and a
file ``current`` holding the newest seq. A state file is UTF-8 text, one
``field<TAB>value`` per line; values escape backslash, tab, newline and
carriage return as ``\\\\``, ``\\t``, ``\\n``, ``\\r``::

    orch-state	1
    label	3.1:5            <fqid>:<seq>, unique per job
    seq	5
    time	1718000000.125
    final	0
    position	17           steps handed out so far (the current step is the 17th)
    steps	1..2000          an integer range; or one "step<TAB>label" line per step, in order
    var	collision	12345    one line per variable: name, value

Every file is written to a temporary name and renamed, so a reader (the
orchestrator harvesting states while the job runs) never sees half a file.
Unknown fields are ignored, so the format can grow.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar, overload

#: The state directory, relative to the job's working directory ($ORCH_HOME).
STATE_DIR = ".orch-state"
#: States of other jobs exported for this one (an aggregator's inputs), by label.
LABELS_DIR = "labels"
FORMAT = "1"
#: What a variable is read as (``int`` or ``float``).
_N = TypeVar("_N", int, float)
#: Used when ORCH_STATE_MAX is not set (outside the orchestrator).
DEFAULT_MAX_SIZE = 4 * 1024 * 1024
#: State files kept in the directory when ORCH_STATE_KEEP is not set.
DEFAULT_KEEP = 5

#: A value's characters a state file writes escaped. NUL too: a state is stored as text by the repository, and
#: PostgreSQL keeps no NUL in text (a raw one refused the write, and every write after it).
_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"}
_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r", "0": "\0"}


class StateError(Exception):
    """A state could not be read, found or saved."""


class StateTooLarge(StateError):
    """``save_state()`` refused a state larger than ``get_max_state_size()``."""


def escape(text: str) -> str:
    if not any(c in text for c in _ESCAPES):
        return text
    return "".join(_ESCAPES.get(c, c) for c in text)


def unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    chars = iter(text)
    for c in chars:
        if c == "\\":
            nxt = next(chars, "")
            out.append(_UNESCAPES.get(nxt, "\\" + nxt))
        else:
            out.append(c)
    return "".join(out)


class Steps(Sequence[str]):
    """A job's steps: an integer range ``"a..b"`` (never expanded) or a list of labels.

    A range of a million steps costs two integers, in memory and on disk.
    """

    def __init__(self, spec: str | Sequence[str | int] | Steps | None = None) -> None:
        self.range: tuple[int, int] | None = None
        self.labels: list[str] | None = None
        if isinstance(spec, Steps):
            self.range, self.labels = spec.range, spec.labels
        elif isinstance(spec, str):
            self.range = parse_range(spec)
        elif spec is not None:
            labels = []
            for i, item in enumerate(spec):
                if isinstance(item, bool) or not isinstance(item, (str, int)):
                    raise ValueError(f"step {i} is a {type(item).__name__}, not a string or an integer")
                label = str(item)
                if not label or any(c in label for c in "\t\n\r"):
                    raise ValueError(f"step {i} ({label!r}) is empty or holds a tab or a line break")
                labels.append(label)
            self.labels = labels

    def __len__(self) -> int:
        if self.range is not None:
            return self.range[1] - self.range[0] + 1
        return len(self.labels or ())

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Steps: ...

    def __getitem__(self, i: int | slice) -> str | Steps:
        n = len(self)
        if isinstance(i, slice):
            start, stop, stride = i.indices(n)
            if stride != 1:
                raise ValueError("steps are sliced contiguously")
            if self.range is not None:
                if stop <= start:
                    return Steps([])
                return Steps(f"{self.range[0] + start}..{self.range[0] + stop - 1}")
            return Steps((self.labels or [])[start:stop])
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        if self.range is not None:
            return str(self.range[0] + i)
        return (self.labels or [])[i]

    def __iter__(self) -> Iterator[str]:
        if self.range is not None:
            return (str(k) for k in range(self.range[0], self.range[1] + 1))
        return iter(self.labels or ())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Steps) and self.spec() == other.spec()

    def __repr__(self) -> str:
        return f"Steps({self.spec()!r})"

    def spec(self) -> str | list[str] | None:
        """What a job definition stores: ``"a..b"``, a list of labels, or ``None``."""
        if self.range is not None:
            return f"{self.range[0]}..{self.range[1]}"
        return list(self.labels) if self.labels else None

    def lines(self) -> list[str]:
        if self.range is not None:
            return [f"steps\t{self.range[0]}..{self.range[1]}"]
        return [f"step\t{label}" for label in self.labels or ()]


def parse_range(text: str) -> tuple[int, int]:
    first, sep, last = text.strip().partition("..")
    try:
        a, b = int(first), int(last)
    except ValueError:
        a = b = 0
        sep = ""
    if not sep or b < a:
        raise ValueError(f"{text!r} is not a range of steps such as '1..1000'")
    return a, b


class State:
    """One state of one job: variables, steps and the position in them.

    ``State()`` in a job loads the job's last saved state (the orchestrator
    placed it in ``$ORCH_HOME/.orch-state`` before the run); outside a job,
    or before anything was saved, it is an empty state with sequence 0.
    ``home``, ``fqid``, ``max_size`` and ``keep`` default to the wrapper's
    ``ORCH_HOME``, ``ORCH_FQID``, ``ORCH_STATE_MAX`` and ``ORCH_STATE_KEEP``.
    """

    def __init__(self, home: str | os.PathLike[str] | None = None, *, fqid: str | None = None,
                 max_size: float | None = None, keep: int | None = None, _text: str | None = None) -> None:
        self.home = Path(home if home is not None else os.environ.get("ORCH_HOME") or ".")
        self.dir = self.home / STATE_DIR
        self.fqid = fqid or os.environ.get("ORCH_FQID") or "job"
        self.max_size = float(max_size if max_size is not None else os.environ.get("ORCH_STATE_MAX") or
                              DEFAULT_MAX_SIZE)
        self.keep = int(keep if keep is not None else os.environ.get("ORCH_STATE_KEEP") or DEFAULT_KEEP)
        self.seq = 0
        self.label = f"{self.fqid}:0"
        self.time = 0.0
        self.final = False
        self.position = 0
        self.steps = Steps()
        self.values: dict[str, str] = {}
        if _text is not None:
            self._parse(_text, "<text>")
            return
        seq = self._current_seq()
        if seq is not None:
            path = self.dir / f"{seq}.state"
            try:
                self._parse(path.read_text(encoding="utf-8"), str(path))
            except FileNotFoundError:
                raise StateError(f"{self.dir / 'current'} names state {seq}, but {path} is missing") from None

    # -------------------------------------------------------------- text
    @classmethod
    def from_text(cls, text: str, *, fqid: str | None = None) -> State:
        """A state from its file's text (as ``orchestrator checkpoint get`` writes it)."""
        return cls(fqid=fqid or "job", _text=text)

    def _parse(self, text: str, where: str) -> None:
        # stored as it is: a value's NUL is written escaped, so a raw one is in a file no state writer made; a lone
        # surrogate, in one read with surrogateescape. (What orchestrator.core.stored.text_fault tells, written out:
        # this module runs alone in a job's process, copied beside it, and imports nothing of the package.)
        if "\0" in text:
            raise StateError(f"{where} is not a state file (it holds a NUL character)")
        try:
            text.encode()
        except UnicodeEncodeError:
            raise StateError(f"{where} is not a state file (it holds a character UTF-8 cannot encode)") from None
        lines = text.splitlines()
        if not lines or lines[0].split("\t")[0] != "orch-state":
            raise StateError(f"{where} is not a state file (it does not begin with 'orch-state')")
        labels: list[str] = []
        try:
            for line in lines[1:]:
                field, _, rest = line.partition("\t")
                if field == "var":
                    name, _, value = rest.partition("\t")
                    self.values[unescape(name)] = unescape(value)
                elif field == "step":
                    labels.append(unescape(rest))
                elif field == "steps":
                    self.steps = Steps(rest)
                elif field == "label":
                    self.label = unescape(rest)
                elif field == "seq":
                    self.seq = int(rest)
                elif field == "time":
                    self.time = float(rest)
                elif field == "final":
                    self.final = rest.strip() == "1"
                elif field == "position":
                    self.position = int(rest)
        except ValueError as exc:
            raise StateError(f"{where}: malformed line: {exc}") from None
        if labels:
            self.steps = Steps(labels)
        if ":" in self.label and self.fqid == "job":
            self.fqid = self.label.rsplit(":", 1)[0]

    def dump(self, label: str | None = None, seq: int | None = None, now: float | None = None) -> str:
        """The state's file text (with another label and seq when given)."""
        lines = [
            f"orch-state\t{FORMAT}",
            f"label\t{escape(label if label is not None else self.label)}",
            f"seq\t{seq if seq is not None else self.seq}",
            f"time\t{now if now is not None else self.time:.3f}",
            f"final\t{1 if self.final else 0}",
            f"position\t{self.position}",
            *self.steps.lines(),
            *(f"var\t{escape(k)}\t{escape(v)}" for k, v in self.values.items()),
        ]
        return "\n".join(lines) + "\n"

    # --------------------------------------------------------- variables
    def save_value(self, name: str, value: object) -> None:
        """Set variable ``name`` (added, or updated) in this state; ``save_state()`` persists it."""
        if not isinstance(name, str) or not name:
            raise StateError("a variable's name must be a non-empty string")
        self.values[name] = value if isinstance(value, str) else str(value)

    def get_string_value(self, name: str, default: str | None = None) -> str | None:
        return self.values.get(name, default)

    def get_int_value(self, name: str, default: int | None = None) -> int | None:
        return self._converted(name, default, int, "an integer")

    def get_double_value(self, name: str, default: float | None = None) -> float | None:
        return self._converted(name, default, float, "a number")

    def _converted(self, name: str, default: _N | None, kind: Callable[[str], _N], what: str) -> _N | None:
        """Variable ``name`` as ``kind`` (``default`` when unset); a value that is not one is a ``StateError``
        naming the variable, never a bare ``ValueError`` from deep inside a user's script."""
        value = self.values.get(name)
        if value is None:
            return default
        try:
            return kind(value)
        except ValueError:
            raise StateError(f"variable {name!r} is {value!r}, not {what}") from None

    # ------------------------------------------------------------- steps
    def get_next_step(self) -> str | None:
        """The next of the job's steps (and move on to it), or ``None`` after the last one."""
        if self.position >= len(self.steps):
            return None
        self.position += 1
        return self.steps[self.position - 1]

    @property
    def current_step(self) -> str | None:
        return self.steps[self.position - 1] if 0 < self.position <= len(self.steps) else None

    # ------------------------------------------------------------ saving
    def set_final_state(self) -> None:
        """Mark this state as the job's last one (an aggregator checks it with ``is_final_state``)."""
        self.final = True

    def get_state_size(self) -> float:
        """Bytes this state takes when saved."""
        return float(len(self.dump(f"{self.fqid}:{self.seq + 1}", self.seq + 1, time.time()).encode()))

    def get_max_state_size(self) -> float:
        """The largest state ``save_state()`` accepts, in bytes (the orchestrator's ``max_state_size``)."""
        return self.max_size

    def save_state(self) -> str:
        """Save this state persistently as the job's newest; return its label.

        Raises :class:`StateTooLarge` (nothing saved) when it exceeds
        ``get_max_state_size()``.
        """
        on_disk = self._current_seq() or 0
        seq = max(self.seq, on_disk) + 1
        label = f"{self.fqid}:{seq}"
        now = time.time()
        data = self.dump(label, seq, now).encode()
        if len(data) > self.max_size:
            raise StateTooLarge(f"state {label} is {len(data)} bytes, more than the maximum of "
                                f"{self.max_size:.0f} (ORCH_STATE_MAX): not saved")
        self.dir.mkdir(parents=True, exist_ok=True)
        _write(self.dir / f"{seq}.state", data)
        _write(self.dir / "current", f"{seq}\n".encode())
        if self.keep > 0 and seq - self.keep >= 0:
            with contextlib.suppress(FileNotFoundError):
                (self.dir / f"{seq - self.keep}.state").unlink()
        self.seq, self.label, self.time = seq, label, now
        return label

    # ----------------------------------------------------------- loading
    def load_state(self, label: str) -> State:
        """Another saved state, by label: one of this job's, or one exported to it (an aggregator's inputs)."""
        fqid, _, seq = label.rpartition(":")
        candidates = [self.dir / LABELS_DIR / f"{label}.state"]
        if fqid == self.fqid and seq.isascii() and seq.isdigit():
            candidates.insert(0, self.dir / f"{int(seq)}.state")
        for path in candidates:
            try:
                text = path.read_text(encoding="utf-8")
            except (FileNotFoundError, NotADirectoryError):
                continue
            loaded = State(self.home, fqid=fqid or self.fqid, max_size=self.max_size, keep=self.keep, _text=text)
            return loaded
        raise StateError(f"no state {label!r} here (looked in {', '.join(str(p) for p in candidates)})")

    def is_final_state(self, label: str | None = None) -> bool:
        """Whether state ``label`` (default: this one) was marked final."""
        return self.final if label is None else self.load_state(label).final

    def _current_seq(self) -> int | None:
        try:
            text = (self.dir / "current").read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return None
        if not text.isdigit():
            raise StateError(f"{self.dir / 'current'} is corrupt ({text[:40]!r})")
        return int(text)

    def __repr__(self) -> str:
        return (f"<State {self.label} final={self.final} step {self.position}/{len(self.steps)} "
                f"{len(self.values)} values>")


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file, then a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def initial_text(fqid: str, steps: str | Sequence[str | int] | None, seq: int = 0, now: float = 0.0) -> str:
    """The text of a job's initial state: its steps, nothing done, no variables."""
    state = State.from_text(f"orch-state\t{FORMAT}\n", fqid=fqid)
    state.steps = Steps(steps)
    return state.dump(f"{fqid}:{seq}", seq, now)


def relabel(text: str, fqid: str, seq: int, now: float) -> str:
    """``text`` (a state, maybe another job's) as state ``seq`` of job ``fqid``."""
    return State.from_text(text, fqid=fqid).dump(f"{fqid}:{seq}", seq, now)


def write_state_dir(directory: Path, text: str, seq: int, exported: dict[str, str] | None = None) -> None:
    """Make ``directory`` hold exactly one state, ``text`` as number ``seq`` (the orchestrator's restore).

    ``exported`` maps other jobs' labels to their state texts (an aggregator's inputs).
    """
    if directory.is_symlink() or directory.is_file():
        directory.unlink()
    elif directory.is_dir():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    _write(directory / f"{seq}.state", text.encode())
    _write(directory / "current", f"{seq}\n".encode())
    if exported:
        labels = directory / LABELS_DIR
        labels.mkdir()
        for label, data in exported.items():
            _write(labels / f"{label}.state", data.encode())


__all__ = ["State", "StateError", "StateTooLarge", "Steps", "escape", "initial_text", "relabel", "unescape",
           "write_state_dir"]
