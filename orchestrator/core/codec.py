"""Events as JSON: what the service streams to its clients, read back into the same objects.

Every event and change a step made travels as ``{"type": "<class>", ...fields}``
with plain values: statuses as their names, a batch of runs as ``{"job",
"indexes"}`` (a range as ``[start, stop]``), an error as its message, fqid and
field. ``decode(encode(e)) == e`` for every event the state machine knows, so
``orch.events()`` yields the same objects through a service as embedded.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from . import events as ev
from .actions import Rule
from .analyser import Limits
from .errors import JobError
from .ids import Runs
from .runlog import RunLog
from .statuses import JobStatus

#: Every event type, by name.
TYPES: dict[str, type[ev.Event]] = {cls.__name__: cls for cls in vars(ev).values()
                                    if isinstance(cls, type) and issubclass(cls, ev.Event) and cls is not ev.Event}


def encode(event: ev.Event) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(event).__name__}
    for f in dataclasses.fields(event):
        out[f.name] = _plain(getattr(event, f.name))
    return out


def decode(data: Mapping[str, Any]) -> ev.Event:
    cls = TYPES.get(str(data.get("type")))
    if cls is None:
        raise ValueError(f"not an event: {data.get('type')!r}")
    hints = typing.get_type_hints(cls, {**vars(ev), "JobError": JobError})
    kwargs = {f.name: _typed(data[f.name], hints[f.name]) for f in dataclasses.fields(cls) if f.name in data}
    return cls(**kwargs)


def _plain(value: Any) -> Any:
    if isinstance(value, JobStatus):
        return value.value
    if isinstance(value, Runs):
        idx = value.indexes
        if idx is None:
            return {"job": value.job, "indexes": None}
        if isinstance(idx, range):
            return {"job": value.job, "range": [idx.start, idx.stop]}
        return {"job": value.job, "indexes": list(idx)}
    if isinstance(value, JobError):
        return {"message": str(value), "fqid": value.fqid, "field": value.field}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or (isinstance(value, Sequence) and not isinstance(value, str)):
        return [_plain(v) for v in value]
    return value


def _typed(value: Any, hint: Any) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if value is None:
        return None
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _typed(value, arg)
            except (TypeError, ValueError, KeyError):
                continue
        return value
    if hint is JobStatus:
        return JobStatus(value)
    if hint is Runs:
        if not isinstance(value, Mapping):
            raise TypeError("not a batch of runs")
        if "range" in value:
            return Runs(value["job"], range(*value["range"]))
        return Runs(value["job"], None if value.get("indexes") is None else tuple(value["indexes"]))
    if hint is JobError:
        error = JobError("")
        error.args = (value["message"],)
        error.fqid, error.field = value.get("fqid"), value.get("field")
        return error
    if hint in (ev.Profile, ev.RunReport, RunLog, Limits, Rule):
        hints = typing.get_type_hints(hint, {**vars(ev), "RunLog": RunLog, "Limits": Limits, "Rule": Rule})
        fields = {f.name: _typed(value[f.name], hints[f.name]) for f in dataclasses.fields(hint) if f.name in value}
        return hint(**fields)
    if origin is tuple or origin is list or origin is Sequence or getattr(origin, "__name__", "") == "Sequence":
        if not isinstance(value, list):
            raise TypeError("not a sequence")
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            return tuple(_typed(v, a) for v, a in zip(value, args, strict=False))
        items = tuple(_typed(v, args[0]) if args else v for v in value)
        return list(items) if origin is list else items
    if origin in (dict, Mapping) or (origin is not None and getattr(origin, "__name__", "") == "Mapping"):
        key, val = args if len(args) == 2 else (Any, Any)
        return {(int(k) if key is int else k): _typed(v, val) for k, v in value.items()}
    return value
