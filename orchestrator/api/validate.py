"""What ``add()`` checks of a definition before anything is stored: bad input is refused naming the field."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..checkpoint import Steps
from ..core.errors import JobError
from ..core.model import Backend, Executable
from ..core.splitters import Splitter
from ..core.stored import text_fault
from ..plugin.postprocess import Postprocessor
from ..plugin.settings import SettingsError
from ..runtime import registry
from ..runtime.limits import exec_limit


def checked_backend(backend: str | Backend | None, fqid: str) -> Backend:
    """The backend with its settings checked by its driver (``JobError`` names ``backend.<setting>``)."""
    backend = Backend.coerce(backend, fqid)
    try:
        cls = registry.driver_class(backend.name)
    except KeyError as exc:
        raise JobError(str(exc.args[0]), fqid=fqid, field="backend") from None
    try:
        settings = cls.validate_settings(backend.settings)
    except SettingsError as exc:
        raise JobError(str(exc), fqid=fqid, field=f"backend.{exc.field}") from None
    return Backend(backend.name, **settings)


def check_json(value: Any, fqid: str, field: str) -> None:
    """``value`` is what a definition may store: JSON, without NaN or infinity (which ``json.dumps`` writes as bare
    tokens no JSON reader takes: SQLite's JSON functions then refused the stored definition at every write, and
    at the home's next open)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        try:  # (refused: dumped again, NaN allowed, only to say why)
            json.dumps(value)
        except (TypeError, ValueError, RecursionError):
            raise JobError(f"{field} must be JSON-able: {exc}", fqid=fqid, field=field) from None
        raise JobError("holds a number that is not finite (NaN or infinity): JSON has none", fqid=fqid,
                       field=field) from None


def check_spec_json(spec: dict[str, Any], fqid: str) -> None:
    """Each field of a built definition (:func:`check_json`), named."""
    for field, value in spec.items():
        check_json(value, fqid, field)


def check_metadata(value: Any, fqid: str) -> None:
    if not isinstance(value, dict):
        raise JobError("metadata must be a dict", fqid=fqid, field="metadata")
    check_json(value, fqid, "metadata")


def validate(job: Any, fqid: str, *, check_backend: bool = True) -> None:
    """Everything ``add()`` can check without running anything; normalises what it checks."""
    if not isinstance(job.name, str):
        raise JobError("name must be a string", fqid=fqid, field="name")
    if (fault := text_fault(job.name)) is not None:  # stored as it is (:mod:`orchestrator.core.stored`)
        why = "a NUL character" if fault == "NUL" else "a character UTF-8 cannot encode (a lone surrogate)"
        raise JobError(f"name must be text: it holds {why}", fqid=fqid, field="name")
    if not isinstance(job.application, Executable):
        raise JobError("application must be Executable(...)", fqid=fqid, field="application")
    job.application.validate(fqid, exec_limit())
    for fieldname in ("inputfiles", "outputfiles"):
        values = getattr(job, fieldname)
        if not all(isinstance(v, str) and v for v in values):
            raise JobError("must be a list of non-empty strings", fqid=fqid, field=fieldname)
    for pattern in job.outputfiles:
        if pattern.startswith("/") or ".." in Path(pattern).parts:
            raise JobError(f"{pattern!r} escapes the job's directory", fqid=fqid, field="outputfiles")
    if job.splitter is not None and not isinstance(job.splitter, Splitter):
        raise JobError("splitter must be a Splitter", fqid=fqid, field="splitter")
    if job.merger is not None and not isinstance(job.merger, Postprocessor):
        raise JobError("merger must be a Merger", fqid=fqid, field="merger")
    for p in job.postprocessors:
        if not isinstance(p, Postprocessor):
            raise JobError(f"{p!r} is not a postprocessor", fqid=fqid, field="postprocessors")
    if job.mode not in ("test", "production"):
        raise JobError(f"mode must be 'test' or 'production', not {job.mode!r}", fqid=fqid, field="mode")
    job.retry.validate(fqid)
    if not isinstance(job.comment, str):
        raise JobError("comment must be a string", fqid=fqid, field="comment")
    check_metadata(job.metadata, fqid)
    if job.fail_on_missing_output is not None and not isinstance(job.fail_on_missing_output, bool):
        raise JobError("must be true or false", fqid=fqid, field="fail_on_missing_output")
    if check_backend:
        job.backend = checked_backend(job.backend, fqid)
        problem = registry.driver_class(job.backend.name).check_executable(job.application.exe, job.backend.settings)
        if problem is not None:
            raise JobError(problem, fqid=fqid, field="application.exe")
    if job.steps is not None or job.step_weights is not None or job._prejob or job._aggregator:
        validate_partition(job, fqid)


def validate_partition(job: Any, fqid: str) -> None:
    """Check steps, their weights, a pre-job and an aggregator (``JobError`` names the field)."""
    n = 0
    if job.steps is not None:
        try:
            steps = Steps(job.steps)
        except (TypeError, ValueError) as exc:
            raise JobError(str(exc), fqid=fqid, field="steps") from None
        job.steps = steps.spec() if steps.range is not None else list(steps.labels or [])
        n = len(steps)
    if job.step_weights is not None:
        if job.steps is None:
            raise JobError("step weights need steps", fqid=fqid, field="step_weights")
        weights = job.step_weights
        if isinstance(weights, (str, bytes)) or len(weights) != n:
            raise JobError(f"must be a list of {n} numbers, one per step", fqid=fqid, field="step_weights")
        for w in weights:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
                raise JobError(f"{w!r} is not a number >= 0", fqid=fqid, field="step_weights")
    from .definition import Definition

    for role in ("prejob", "aggregator"):
        definition = getattr(job, f"_{role}")
        if definition is None:
            continue
        if not isinstance(definition, Definition) or getattr(definition, "_registry", None) is not None:
            raise JobError(f"{role} must be a new Job(...), not {definition!r}", fqid=fqid, field=role)
        if job.splitter is None:
            raise JobError(f"a {role} needs a partitioned job (one with a splitter)", fqid=fqid, field=role)
        if definition.splitter is not None or definition._prejob is not None or definition._aggregator is not None:
            raise JobError(f"the {role} cannot have a splitter, a prejob or an aggregator of its own", fqid=fqid,
                           field=role)
        validate(definition, f"{fqid} ({role})")
    ms = job.min_success
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not 0 <= ms <= 1:
        raise JobError(f"must be a fraction between 0 and 1, not {ms!r}", fqid=fqid, field="min_success")
