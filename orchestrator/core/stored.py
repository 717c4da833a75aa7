"""What a repository keeps as text, as it is given: one definition for every value stored raw (a job's name, a
backend id; a saved state's text is checked the same way by :mod:`orchestrator.checkpoint`, which runs alone in a
job's process and so writes the check out).

PostgreSQL keeps no NUL in ``text``, and neither repository takes a lone surrogate (a ``str`` decoded with
``surrogateescape``). A value one refused was put back in the writer's queue at every flush, so nothing of the
home was written again: such a value is refused where it comes in, each caller saying so in its own words.

And how much of a reason it keeps (:data:`MAX_TEXT`): a run's reason is stored thrice in its record (its
reason, its history's entry, 100 entries kept).
"""

from __future__ import annotations

from typing import Literal

#: The most of a reason kept (characters), wherever it comes from: a keyword's data in a run's log (a reason, a
#: retry's arguments), what a checker or merger answers, a driver's reason for a run or its error. A line of
#: megabytes made a record the repository refused (SQLite's limit is a billion bytes a value).
MAX_TEXT = 16 << 10

#: What in a value no repository keeps as text.
TextFault = Literal["NUL", "surrogate"]


def text_fault(value: str) -> TextFault | None:
    """The first thing in ``value`` no repository keeps as text, or ``None`` when it keeps it as it is."""
    if "\0" in value:
        return "NUL"
    if not value.isascii():  # (ASCII encodes: the common case costs one scan in C)
        try:
            value.encode()
        except UnicodeEncodeError:
            return "surrogate"
    return None


def kept(reason: str) -> str:
    """``reason`` as a run's record keeps it: its first :data:`MAX_TEXT` characters."""
    return reason if len(reason) <= MAX_TEXT else reason[:MAX_TEXT]
