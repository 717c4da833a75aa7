"""Useful and wasted CPU (GBS), from the attempts' own records: pure functions, no I/O.

The job wrapper appends one record per attempt to the run's output dir,
``orch.usage``: the attempt, the saved state it started from and the newest
one when it stopped, its start and end, its exit code, and the shell's
``times`` (its own and its children's user and system CPU). An attempt is
**useful** when it ended in success (exit code 0) or when a later attempt
resumed from a state it saved; every other attempt is **wasted**, and is
charged to its cause: the failure history entry of that attempt
(``level: verdict``), else ``killed`` for an attempt stopped by a signal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The file of a run's output dir that holds its attempts' records.
USAGE_FILE = "orch.usage"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt's own record."""

    attempt: int
    started_from: int
    newest: int
    start: float
    end: float
    code: int
    cpu: float

    @property
    def wall(self) -> float:
        return max(0.0, self.end - self.start)


#: Past the CPU time one attempt may have used (some 31 years): a record that says more is no record.
MOST_SECONDS = 1e9
#: The most records of one run's file taken in (a record per attempt; a run may write more of its own).
MOST_RECORDS = 256


def _seconds(text: str) -> float:
    """``1m2.500000s`` (the shell's ``times``) in seconds. The file is in the run's output dir, where the run may
    write too: a negative, infinite or absurd time (:data:`MOST_SECONDS`) is no time (Prometheus' counter raised
    on a negative one, and stayed infinite for good after an infinite one), and its record is skipped as a torn
    one is."""
    minutes, _, rest = text.rstrip("s").partition("m")
    seconds = float(minutes) * 60 + float(rest)
    if not (0 <= seconds < MOST_SECONDS and float(minutes) >= 0 and float(rest) >= 0):
        raise ValueError(f"not a time: {text[:40]!r}")
    return seconds


def parse_usage(text: str) -> list[Attempt]:
    """The records of an ``orch.usage`` file (a head line and two lines of ``times``); a torn record is skipped,
    and only the last :data:`MOST_RECORDS` are kept (judging them compares each with each)."""
    lines = text.splitlines()
    out: list[Attempt] = []
    i = 0
    while i < len(lines):
        try:
            head = lines[i].split()
            attempt, started_from, newest, code = int(head[0]), int(head[1]), int(head[2]), int(head[5])
            start, end = float(head[3]), float(head[4])
            if not (math.isfinite(start) and math.isfinite(end)):
                raise ValueError("not a time")
            own, children = lines[i + 1].split(), lines[i + 2].split()
            cpu = sum(_seconds(t) for t in (*own[:2], *children[:2]))
        except (ValueError, IndexError):
            i += 1
            continue
        out.append(Attempt(attempt, started_from, newest, start, end, code, cpu))
        i += 3
    return out[-MOST_RECORDS:]


def judge(attempts: Sequence[Attempt], history: Sequence[Mapping[str, Any]]) -> list[tuple[Attempt, str | None]]:
    """Each attempt with ``None`` (useful) or the cause it is wasted for."""
    causes = {int(h["attempt"]): f"{h.get('level', '?')}: {h.get('verdict', '?')}" for h in history
              if "attempt" in h and h.get("verdict") not in ("refused",)}
    out: list[tuple[Attempt, str | None]] = []
    for a in attempts:
        resumed = any(b.attempt > a.attempt and a.started_from < b.started_from <= a.newest for b in attempts)
        if a.code == 0 or resumed:
            out.append((a, None))
        else:
            out.append((a, causes.get(a.attempt) or ("killed" if a.code >= 128 else f"exit code {a.code}")))
    return out


@dataclass(slots=True)
class Tally:
    """Attempts added up: CPU (useful and wasted, the wasted part by cause) and wall seconds."""

    attempts: int = 0
    useful: float = 0.0
    wasted: float = 0.0
    wall: float = 0.0
    by_cause: dict[str, float] = field(default_factory=dict)

    @property
    def cpu(self) -> float:
        return self.useful + self.wasted

    def add(self, attempts: Sequence[Attempt], history: Sequence[Mapping[str, Any]] = ()) -> Tally:
        """Judge ``attempts`` (one run's, all of them: a later one may make an earlier one useful) and add them."""
        for a, cause in judge(attempts, history):
            self.attempts += 1
            self.wall += a.wall
            if cause is None:
                self.useful += a.cpu
            else:
                self.wasted += a.cpu
                self.by_cause[cause] = self.by_cause.get(cause, 0.0) + a.cpu
        return self


def tally(attempts: Sequence[Attempt], history: Sequence[Mapping[str, Any]] = ()) -> Tally:
    """One run's attempts judged and added up: what ``orchestrator report`` and the CPU metrics both count."""
    return Tally().add(attempts, history)


__all__ = ["USAGE_FILE", "Attempt", "Tally", "judge", "parse_usage", "tally"]
