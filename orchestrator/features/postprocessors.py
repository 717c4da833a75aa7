"""The built-in postprocessors: mergers of subjobs' outputs, checkers that fail completed subjobs.

The notifier, which mails a master's end, is in :mod:`.notifier`.

They implement the SDK's :class:`~orchestrator.plugin.postprocess.Postprocessor`
and are registered as entry points, as a third party's would be; the runtime
runs them by name, never by import.
"""

from __future__ import annotations

import gzip
import importlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..core.statuses import JobStatus
from ..plugin.postprocess import Merger, PostprocessContext, Postprocessor, PostprocessResult

Rows = Sequence[tuple[int, JobStatus, Path]]


class TextMerger(Merger):
    """Concatenate the named output files of all subjobs, in index order."""

    name = "text"

    def __init__(self, files: Sequence[str] = ("stdout",), ignorefailed: bool = False, overwrite: bool = False,
                 compress: bool = False) -> None:
        self.files = [files] if isinstance(files, str) else list(files)
        self.ignorefailed = ignorefailed
        self.overwrite = overwrite
        #: Write ``NAME.gz`` (gzip) instead of ``NAME``.
        self.compress = compress

    def params(self) -> dict[str, Any]:
        return {"files": self.files, "ignorefailed": self.ignorefailed, "overwrite": self.overwrite,
                "compress": self.compress}

    def merge(self, outputdir: Path, subjobs: Sequence[tuple[int, JobStatus, Path]]) -> str | None:
        not_done = [i for i, status, _ in subjobs if status != JobStatus.COMPLETED]
        if not_done and not self.ignorefailed:
            shown = ", ".join(map(str, not_done[:10])) + ("..." if len(not_done) > 10 else "")
            return f"TextMerger: subjobs {shown} did not complete (ignorefailed=False)"
        outputdir.mkdir(parents=True, exist_ok=True)
        made = _made_before(outputdir)
        for name in self.files:
            if Path(name).name != name or name in ("", ".", ".."):
                return f"TextMerger: {name!r} is not a plain file name"
            target = outputdir / (f"{name}.gz" if self.compress else name)
            # its own earlier output is replaced (a resubmission, 'orchestrator merge'); anything else is kept
            if target.exists() and not self.overwrite and target.name not in made:
                return f"TextMerger: {target} exists (overwrite=False)"
            tmp = target.with_name(f".{target.name}.merging")
            opener = gzip.open if self.compress else open
            with opener(tmp, "wb") as out:
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
            _remember(outputdir, made, target.name)
        return None


#: In a master's output dir: the names of the files its mergers wrote, one a line.
MADE = ".orch-merged"


def _made_before(outputdir: Path) -> set[str]:
    try:
        return set((outputdir / MADE).read_text(encoding="utf-8").split("\n")) - {""}
    except FileNotFoundError:
        return set()


def _remember(outputdir: Path, made: set[str], name: str) -> None:
    if name not in made:
        made.add(name)
        with open(outputdir / MADE, "a", encoding="utf-8") as out:
            out.write(name + "\n")


def dotted_name(fn: Callable[..., Any], kind: str) -> str:
    """``module:qualname`` of a module-level function: how a custom postprocessor is stored and rebuilt."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or not qualname or "<" in qualname or module == "__main__":
        raise ValueError(f"{kind}: {fn!r} cannot be stored; give a function defined at the top level of an "
                         f"importable module, or its name as 'module:function'")
    return f"{module}:{qualname}"


def resolve(name: str, kind: str) -> Callable[..., Any]:
    module, _, attr = name.partition(":")
    if not module or not attr:
        raise ValueError(f"{kind}: {name!r} is not 'module:function'")
    target: Any = importlib.import_module(module)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{kind}: {name!r} is not callable")
    return target  # type: ignore[no-any-return]


class CustomMerger(Merger):
    """A merger written by the user: ``merge(outputdir, [(index, status, subjob outputdir)])`` returns ``None``
    (merged) or a reason that fails the master. Give the function, or its name as ``"module:function"``."""

    name = "custom_merger"

    def __init__(self, merge: Callable[[Path, Rows], str | None] | str) -> None:
        self.function = merge if isinstance(merge, str) else dotted_name(merge, "CustomMerger")

    def params(self) -> dict[str, Any]:
        return {"merge": self.function}

    def merge(self, outputdir: Path, subjobs: Rows) -> str | None:
        outputdir.mkdir(parents=True, exist_ok=True)
        result = resolve(self.function, "CustomMerger")(outputdir, list(subjobs))
        return None if result is None else str(result)


class Checker(Postprocessor):
    """A postprocessor that looks at each completed subjob and fails those it finds wanting, saying why."""

    @staticmethod
    def completed(context: PostprocessContext) -> list[tuple[int, Path]]:
        return [(s.index, s.outputdir) for s in context.subjobs if s.status == JobStatus.COMPLETED]


class FileChecker(Checker):
    """Fail a completed subjob whose output ``files`` match one of ``patterns`` (regular expressions, ``^`` and
    ``$`` at each line's start and end), or,
    with ``fail_if_found=False``, match none of them. A missing file fails it unless ``files_must_exist=False``
    (Ganga's FileChecker)."""

    name = "file_checker"

    def __init__(self, files: Sequence[str] | str = ("stdout",), patterns: Sequence[str] | str = (),
                 fail_if_found: bool = True, files_must_exist: bool = True) -> None:
        self.files = [files] if isinstance(files, str) else list(files)
        self.patterns = [patterns] if isinstance(patterns, str) else list(patterns)
        if not self.patterns:
            raise ValueError("FileChecker: give at least one pattern")
        for pattern in self.patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"FileChecker: pattern {pattern!r} is not a regular expression: {exc}") from None
        for name in self.files:
            if Path(name).name != name or name in ("", ".", ".."):
                raise ValueError(f"FileChecker: {name!r} is not a plain file name")
        self.fail_if_found = fail_if_found
        self.files_must_exist = files_must_exist

    def params(self) -> dict[str, Any]:
        return {"files": self.files, "patterns": self.patterns, "fail_if_found": self.fail_if_found,
                "files_must_exist": self.files_must_exist}

    def run(self, context: PostprocessContext) -> PostprocessResult:
        compiled = [re.compile(p, re.MULTILINE) for p in self.patterns]  # ^ and $ at each line
        failed: list[tuple[int, str]] = []
        for index, outputdir in self.completed(context):
            reason = self._check(outputdir, compiled)
            if reason is not None:
                failed.append((index, f"FileChecker: {reason}"))
        return PostprocessResult(failed_subjobs=failed)

    def _check(self, outputdir: Path, compiled: list[re.Pattern[str]]) -> str | None:
        for name in self.files:
            try:
                text = (outputdir / name).read_text(errors="replace")
            except FileNotFoundError:
                if self.files_must_exist:
                    return f"no output file {name!r}"
                continue
            found = next((p.pattern for p in compiled if p.search(text)), None)
            if self.fail_if_found and found is not None:
                return f"{name} matches {found!r}"
            if not self.fail_if_found and found is None:
                return f"{name} matches none of {', '.join(map(repr, self.patterns))}"
        return None


class CustomChecker(Checker):
    """A checker written by the user: ``check(outputdir)`` of each completed subjob returns ``True`` or
    ``None`` (it passes), ``False`` or a reason (it fails). The function, or ``"module:function"``."""

    name = "custom_checker"

    def __init__(self, check: Callable[[Path], bool | str | None] | str) -> None:
        self.function = check if isinstance(check, str) else dotted_name(check, "CustomChecker")

    def params(self) -> dict[str, Any]:
        return {"check": self.function}

    def run(self, context: PostprocessContext) -> PostprocessResult:
        check = resolve(self.function, "CustomChecker")
        failed: list[tuple[int, str]] = []
        for index, outputdir in self.completed(context):
            verdict = check(outputdir)
            if verdict is False or isinstance(verdict, str):
                why = verdict if isinstance(verdict, str) else f"{self.function} said no"
                failed.append((index, f"CustomChecker: {why}"))
        return PostprocessResult(failed_subjobs=failed)


__all__ = ["Checker", "CustomChecker", "CustomMerger", "FileChecker", "TextMerger"]
