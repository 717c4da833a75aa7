"""A job's steps (DataGrid's JobSteps): an integer range ``"a..b"`` or a list of labels, never expanded.

Pure: the splitter that partitions them (:class:`~.splitters.StepSplitter`),
the State API on the worker (:mod:`orchestrator.checkpoint`) and the
aggregator's labels all read steps through this one class.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload


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
