"""Checked values for the workflow model: the error type and the small validators that name the field.

Kept apart from :mod:`.model` so that the model reads as the DØ record it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core.errors import OrchestratorError
from ...core.model import Backend, RetryPolicy


class WorkflowError(OrchestratorError):
    """A workflow is invalid or an operation on it was refused.

    ``file`` names the data file at fault (a cycle, a missing producer), ``field``
    the definition's key, e.g. ``stage[1].line[0].package[0].binary[0].inputs[2]``.
    """

    def __init__(self, message: str, *, workflow: str | None = None, field: str | None = None,
                 file: str | None = None) -> None:
        prefix = f"workflow {workflow}: " if workflow else ""
        where = f" [field {field}]" if field else ""
        super().__init__(f"{prefix}{message}{where}")
        self.workflow, self.field, self.file = workflow, field, file


def fail(message: str, where: str, file: str | None = None) -> WorkflowError:
    return WorkflowError(message, field=where or None, file=file)


def check_keys(data: Mapping[str, Any], known: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in known:
            raise fail(f"unknown key {key!r} (expected one of: {', '.join(known)})", f"{where}.{key}".lstrip("."))


def string(value: Any, where: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise fail(f"must be a{'' if empty else ' non-empty'} string, not {value!r}", where)
    return value


def integer(value: Any, where: str, *, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        raise fail(f"must be an integer{f' >= {minimum}' if minimum is not None else ''}, not {value!r}", where)
    return value


def number(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise fail(f"must be a number >= 0, not {value!r}", where)
    return float(value)


def array(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise fail(f"must be an array, not {type(value).__name__}", where)
    return value


def table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise fail(f"must be a table, not {type(value).__name__}", where)
    return value


def check_file_name(name: Any, where: str) -> str:
    """A file of the data dir: a plain name, so that it can neither escape the dir nor clash."""
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or "\0" in name \
            or "\n" in name or name.startswith(".orch"):
        raise fail(f"a file name must be a plain name (no '/', not '.', '..' or '.orch*'), not {name!r}", where,
                    file=name if isinstance(name, str) else None)
    return name


def backend(value: Any, where: str) -> Backend | None:
    if value is None or isinstance(value, Backend):
        return value
    if isinstance(value, str):
        return Backend(value)
    data = dict(table(value, where))
    name = string(data.pop("name", "local"), f"{where}.name", empty=False)
    return Backend(name, **data)


def backend_dict(backend: Backend) -> str | dict[str, Any]:
    return {"name": backend.name, **backend.settings} if backend.settings else backend.name


def retry(value: Any, where: str) -> RetryPolicy | None:
    if value is None or isinstance(value, RetryPolicy):
        return value
    data = table(value, where)
    check_keys(data, tuple(RetryPolicy.__dataclass_fields__), where)
    return RetryPolicy(**dict(data))
