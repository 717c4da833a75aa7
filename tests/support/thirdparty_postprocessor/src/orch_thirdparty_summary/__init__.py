"""``JsonSummary``: a third party's postprocessor, written against ``orchestrator.plugin.postprocess`` only.

Once every subjob of a master ended, it writes ``summary.json`` in the
master's output dir: the subjobs per status, and for each completed subjob
the number of lines of each file named in ``files``. A completed subjob
without one of them fails the master (the postprocessor's error), unless
``missing_ok``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from orchestrator.plugin.postprocess import PostprocessContext, Postprocessor, PostprocessResult


class JsonSummary(Postprocessor):
    name = "json_summary"  # the entry point's name: how the job stores it and how it is rebuilt

    def __init__(self, files: Sequence[str] = ("stdout",), missing_ok: bool = False) -> None:
        self.files = list(files)
        self.missing_ok = missing_ok

    def params(self) -> dict[str, Any]:
        return {"files": self.files, "missing_ok": self.missing_ok}

    def run(self, context: PostprocessContext) -> PostprocessResult:
        lines: dict[str, dict[str, int]] = {}
        for sub in context.subjobs:
            if sub.status != "completed":
                continue
            counted = {}
            for name in self.files:
                try:
                    counted[name] = len((sub.outputdir / name).read_text(errors="replace").splitlines())
                except FileNotFoundError:
                    if not self.missing_ok:
                        return PostprocessResult(f"JsonSummary: subjob {sub.index} has no {name!r}")
            lines[str(sub.index)] = counted
        context.outputdir.mkdir(parents=True, exist_ok=True)
        summary = {"job": context.fqid, "name": context.name, "counts": dict(context.counts), "lines": lines}
        (context.outputdir / "summary.json").write_text(json.dumps(summary, sort_keys=True) + "\n")
        return PostprocessResult()
