"""What the job wrapper's log says about one run, parsed: pure, so the analyser can judge without I/O.

The wrapper (``orchestrator/scripts/wrapper.sh``) writes one line per event,
``<time> <WORD> <data>``: ``START <pid> <host>``, the application's keywords
(``SUCCEEDED``, ``FAILED``, ``RETRY``, ``HOLD``, ``INFO``, ``RETURN_FILE``),
``REFUSED`` for a returned file it would not move, ``EXIT <code>`` and
``END <code>``. The runtime reads the file; this module only reads its text.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .stored import MAX_TEXT


@dataclass
class RunLog:
    """What the wrapper's log says about one run."""

    started: float | None = None
    #: The host the run ran on (the START line's second word; ``None`` in a log written before it said so).
    host: str | None = None
    exit_code: int | None = None
    ended: float | None = None
    end_code: int | None = None
    keywords: list[tuple[float, str, str]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.end_code is not None


#: The most of a keyword's data kept (characters): a reason, a retry's arguments. The run writes its log, and
#: the data of its FAILED, RETRY and HOLD lines is stored thrice in its record (its reason, its history's entry,
#: 100 entries kept): a line of megabytes made a record the repository refused, and it stopped every write.
MAX_KEYWORD_DATA = MAX_TEXT


#: The most keyword lines a log's reading keeps: the first of the terminal ones (SUCCEEDED, FAILED, RETRY,
#: HOLD: more than one is an error, listed), and the last of the others (REFUSED, NOMATCH, INFO...). A run may
#: write its log as it likes, and each line kept is carried with its report and stored.
MAX_TERMINAL = 16
MAX_KEYWORDS = 1000
#: The keywords that end a run by its own word (at most one a log).
TERMINAL = ("SUCCEEDED", "FAILED", "RETRY", "HOLD")


def parse_log(text: str) -> RunLog:
    """Read ``orch.log``'s text; malformed lines are skipped, never a crash. Of its keyword lines, the first
    :data:`MAX_TERMINAL` terminal ones and the last :data:`MAX_KEYWORDS` others are kept, in the log's order."""
    log = RunLog()
    terminal: list[tuple[int, tuple[float, str, str]]] = []
    others: deque[tuple[int, tuple[float, str, str]]] = deque(maxlen=MAX_KEYWORDS)
    for n, line in enumerate(text.splitlines()):
        parts = line.split(" ", 2)
        if len(parts) < 2:
            continue
        try:
            ts = float(parts[0])
        except ValueError:
            continue
        if not 0 <= ts < 1e11:  # (NaN too) the run may write its log: a time that is no time made a master's NaN
            continue
        word, data = parts[1], parts[2] if len(parts) > 2 else ""
        if word == "START":
            log.started = ts
            said = data.split()
            log.host = said[1] if len(said) > 1 and said[1] != "-" else None
        elif word == "EXIT":
            log.exit_code = _int(data)
        elif word == "END":
            log.ended, log.end_code = ts, _int(data)
        elif word in TERMINAL:
            if len(terminal) < MAX_TERMINAL:
                terminal.append((n, (ts, word, data[:MAX_KEYWORD_DATA])))
        else:
            others.append((n, (ts, word, data[:MAX_KEYWORD_DATA])))
    log.keywords = [k for _, k in sorted(terminal + list(others))] if terminal else [k for _, k in others]
    return log


def _int(text: str) -> int | None:
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None
