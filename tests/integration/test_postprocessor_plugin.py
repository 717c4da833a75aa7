"""A postprocessor from a separately installed distribution works like a built-in one, embedded and through a service.

``tests/support/thirdparty_postprocessor/`` is its own distribution
(``orchestrator-json-summary``) that registers ``json_summary`` through the
entry-point group ``orchestrator.postprocessors`` and nothing else. This
module pip-installs it, runs jobs with it (beside a built-in
``FileChecker(fail_if_found=False)``), and uninstalls it at the end. Through
a service the job's definition crosses the socket as stored data: the
service rebuilds the postprocessor by its entry point alone.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from plugin_install import installed

from orchestrator import ArgSplitter, Executable, FileChecker, Job, Orchestrator, plugins

PLUGIN_SRC = Path(__file__).resolve().parents[1] / "support" / "thirdparty_postprocessor"
DIST = "orchestrator-json-summary"
MODULE = "orch_thirdparty_summary"

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def summary_plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The distribution installed for this module's tests; yields its ``JsonSummary`` class."""
    src = tmp_path_factory.mktemp("thirdparty") / DIST  # built from a copy: nothing left in the source tree
    shutil.copytree(PLUGIN_SRC, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    with installed(src, DIST, MODULE):
        yield importlib.import_module(MODULE).JsonSummary


async def test_registered_through_the_entry_point_only(summary_plugin: Any) -> None:
    dist = importlib.metadata.distribution(DIST)
    eps = [(ep.name, ep.value) for ep in dist.entry_points]
    assert eps == [("json_summary", f"{MODULE}:JsonSummary")]
    cls = plugins.postprocessor_class("json_summary")
    assert cls is summary_plugin and cls.__module__ == MODULE
    assert PLUGIN_SRC.resolve() not in Path(sys.modules[MODULE].__file__ or "").resolve().parents


async def test_a_third_party_summary_and_a_checker_that_wants_a_line(summary_plugin: Any, api_home: Path) -> None:
    """Subjob i prints 1..i+1: the summary counts the lines; the checker fails those without a line "3"."""
    job = Job(name="counted", application=Executable("/bin/sh"),
              splitter=ArgSplitter([["-c", f"seq 1 {i + 1}"] for i in range(4)]), backend="local",
              postprocessors=[summary_plugin(files=["stdout"]),
                              FileChecker(files=["stdout"], patterns=["^3$"], fail_if_found=False)])
    async with Orchestrator(home=api_home) as orch:
        j = await orch.jobs.add(job)
        await j.submit()
        await j.wait(timeout=60)
        assert [s.status.value for s in j.subjobs] == ["failed", "failed", "completed", "completed"]
        assert j.status == "failed"
        for sub in j.subjobs[:2]:
            assert sub.info.reason == "FileChecker: stdout matches none of '^3$'"
            assert (sub.info.history[-1]["level"], sub.info.history[-1]["verdict"]) == ("postprocess", "checked")
        summary = json.loads((j.outputdir / "summary.json").read_text())
        assert summary == {"job": j.fqid, "name": "counted", "counts": {"completed": 4},
                           "lines": {"0": {"stdout": 1}, "1": {"stdout": 2}, "2": {"stdout": 3}, "3": {"stdout": 4}}}
    async with Orchestrator(home=api_home) as orch:  # stored by name and parameters, rebuilt by entry point
        again = orch.jobs[j.id]
        assert [type(p).__name__ for p in again.postprocessors] == ["JsonSummary", "FileChecker"]
        assert again.postprocessors[0].params() == {"files": ["stdout"], "missing_ok": False}
        assert again.postprocessors[1].params()["fail_if_found"] is False
