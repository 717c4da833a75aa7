"""Mergers: postprocessors run once on a master after every subjob ended.

A merger returns ``None`` on success or a reason string on failure; the
master is then ``failed`` with that reason. Mergers are plugins of the
entry-point group ``orchestrator.mergers``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from .status import JobStatus


class Merger(ABC):
    name: ClassVar[str] = ""

    @abstractmethod
    def merge(self, outputdir: Path, subjobs: Sequence[tuple[int, JobStatus, Path]]) -> str | None:
        """Merge from ``(index, status, outputdir)`` of each subjob into ``outputdir``."""

    @abstractmethod
    def params(self) -> dict[str, Any]: ...

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


class TextMerger(Merger):
    """Concatenate the named output files of all subjobs, in index order."""

    name = "text"

    def __init__(self, files: Sequence[str] = ("stdout",), ignorefailed: bool = False, overwrite: bool = False) -> None:
        self.files = list(files)
        self.ignorefailed = ignorefailed
        self.overwrite = overwrite

    def params(self) -> dict[str, Any]:
        return {"files": self.files, "ignorefailed": self.ignorefailed, "overwrite": self.overwrite}

    def merge(self, outputdir: Path, subjobs: Sequence[tuple[int, JobStatus, Path]]) -> str | None:
        not_done = [i for i, status, _ in subjobs if status != JobStatus.COMPLETED]
        if not_done and not self.ignorefailed:
            shown = ", ".join(map(str, not_done[:10])) + ("..." if len(not_done) > 10 else "")
            return f"TextMerger: subjobs {shown} did not complete (ignorefailed=False)"
        outputdir.mkdir(parents=True, exist_ok=True)
        for name in self.files:
            if Path(name).name != name or name in ("", ".", ".."):
                return f"TextMerger: {name!r} is not a plain file name"
            target = outputdir / name
            if target.exists() and not self.overwrite:
                return f"TextMerger: {target} exists (overwrite=False)"
            tmp = target.with_name(f".{name}.merging")
            with tmp.open("wb") as out:
                for i, status, subdir in subjobs:
                    if status != JobStatus.COMPLETED:
                        continue
                    try:
                        out.write((subdir / name).read_bytes())
                    except FileNotFoundError:
                        if not self.ignorefailed:
                            tmp.unlink()
                            return f"TextMerger: subjob {i} has no output file {name!r}"
            tmp.replace(target)
        return None
