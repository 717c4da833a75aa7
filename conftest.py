"""The docs as tests: every code block of README.md and docs/*.md is collected by Sybil (``tests/support/docblocks.py``
says how each kind runs). Run them alone with ``python -m pytest README.md docs``; the summary line counts them."""

from __future__ import annotations

import pytest
from docblocks import sybil, tally

pytest_collect_file = sybil.pytest()

_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and report.nodeid.startswith(("README.md", "docs/")):
        _skipped.append(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if tally or _skipped:
        terminalreporter.write_line(
            f"docs: {tally['executed']} code blocks executed, {len(_skipped)} marked illustration "
            f"({tally['written']} written as files for the blocks after them, {tally['parsed']} toml/json parsed)")
