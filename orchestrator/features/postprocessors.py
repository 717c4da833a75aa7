"""The built-in postprocessors: mergers of subjobs' outputs (and, as they come, checkers and notifiers).

They implement the SDK's :class:`~orchestrator.plugin.postprocess.Postprocessor`
and are registered as entry points, as a third party's would be; the runtime
runs them by name, never by import.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..core.statuses import JobStatus
from ..plugin.postprocess import Merger


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
