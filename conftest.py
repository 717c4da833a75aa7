"""The docs as tests: every code block of README.md and docs/*.md is collected by Sybil (``tests/support/docblocks.py``
says how each kind runs). Run them alone with ``python -m pytest README.md docs``; the summary line counts them.

The suite runs on two pytest-xdist workers (``addopts``); each worker counts the blocks it ran and hands the count to
the controller when it ends (``workeroutput``), which adds them up for the summary line."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest
from docblocks import sybil, tally

pytest_collect_file = sybil.pytest()

if "PYTEST_XDIST_WORKER" in os.environ:  # a worker gets COLUMNS=80 and LINES=24 from xdist; a user's pipe has none
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)

_skipped: list[str] = []
_workers: Counter[str] = Counter()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and report.nodeid.startswith(("README.md", "docs/")):
        _skipped.append(report.nodeid)  # the controller sees every worker's reports


def pytest_sessionfinish(session: pytest.Session) -> None:
    output: dict[str, Any] | None = getattr(session.config, "workeroutput", None)
    if output is not None:  # a worker: its count goes to the controller
        output["docs_tally"] = dict(tally)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    _workers.update(getattr(node, "workeroutput", {}).get("docs_tally", {}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    counts = tally + _workers
    if counts or _skipped:
        terminalreporter.write_line(
            f"docs: {counts['executed']} code blocks executed, {len(_skipped)} marked illustration "
            f"({counts['written']} written as files for the blocks after them, {counts['parsed']} toml/json parsed)")
