"""``orchestrator.workflow``: the workflows of docs/workflows.md under the name the guide imports.

An alias of :mod:`orchestrator.features.workflows` (the same objects): ``from orchestrator.workflow import
Binary, FileSpec, Line, Package, Stage, Workflow, Workflows``.
"""

from .features.workflows import (
    Binary,
    Dag,
    FileSpec,
    Line,
    Package,
    PackageView,
    Stage,
    Workflow,
    WorkflowError,
    WorkflowFileError,
    WorkflowRun,
    Workflows,
    build,
    load_workflow,
    parse_dagman,
    to_dagman,
)

__all__ = [
    "Binary", "Dag", "FileSpec", "Line", "Package", "PackageView", "Stage", "Workflow", "WorkflowError",
    "WorkflowFileError", "WorkflowRun", "Workflows", "build", "load_workflow", "parse_dagman", "to_dagman",
]
