"""Multi-stage workflows whose dependencies are implied by files (DØ's job definition).

``Workflow`` → ``Stage`` → ``Line`` → ``Package`` → ``Binary``, with ``FileSpec``
inputs and outputs, defined in Python or TOML (:func:`load_workflow`).
``Workflows(orch)`` runs them on an open orchestrator, each package as an
ordinary job::

    async with Orchestrator(home=...) as orch, Workflows(orch) as wfs:
        w = await wfs.submit(Workflow(...))
        await w.wait(timeout=600)        # also: kill_line, release, hold, restart, dagman

See ``docs/workflows.md``.
"""

from .dag import Dag, build
from .dagman import parse_dagman, to_dagman
from .handle import PackageView, WorkflowRun
from .model import Binary, FileSpec, Line, Package, Stage, Workflow
from .runner import Workflows
from .toml import WorkflowFileError, load_workflow
from .values import WorkflowError

__all__ = [
    "Binary", "Dag", "FileSpec", "Line", "Package", "PackageView", "Stage", "Workflow", "WorkflowError",
    "WorkflowFileError", "WorkflowRun", "Workflows", "build", "load_workflow", "parse_dagman", "to_dagman",
]
