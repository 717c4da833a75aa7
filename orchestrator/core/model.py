"""The plain-data parts of a job: application, backend, retry policy, info.

These are what a user builds and what the repository stores. They hold no
reference to an orchestrator; :mod:`orchestrator.api.job` adds the behaviour.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import JobError
from .table import RunRecord

_ATOMS = frozenset({str, int, float, bool, type(None)})


def plain_copy(value: Any) -> Any:
    """A deep copy of JSON-like data (dicts, lists, atoms), several times cheaper than ``copy.deepcopy``.

    Subjob definitions and infos are copied 100,000 times in a large split; anything
    that is not plain data falls back to ``copy.deepcopy``.
    """
    kind = type(value)
    if kind in _ATOMS:
        return value
    if kind is dict:
        return {k: plain_copy(v) for k, v in value.items()}
    if kind is list:
        return [plain_copy(v) for v in value]
    if kind is tuple:
        return tuple(plain_copy(v) for v in value)
    return copy.deepcopy(value)


#: The longest single argument or ``NAME=value`` string Linux passes to a program (MAX_ARG_STRLEN:
#: 32 pages of 4 KiB). Longer ones fail at ``exec`` with "Argument list too long" (exit 126).
MAX_ARG_STRLEN = 131072


def exec_size(exe: str, args: Sequence[str], env: Mapping[str, str]) -> int:
    """The bytes ``exec`` needs for this command line and environment: each string, its NUL, its pointer."""
    strings = [exe, *args, *(f"{k}={v}" for k, v in env.items())]
    return sum(len(s.encode()) + 1 + 8 for s in strings)


@dataclass
class Executable:
    """Run ``exe`` with ``args`` and extra environment ``env`` on the worker."""

    exe: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def validate(self, fqid: str, exec_limit: int | None = None) -> None:
        """Check types and sizes; ``exec_limit``: the bytes the system leaves for the arguments and the
        environment (``ARG_MAX`` less what the wrapper's own environment takes), checked when given."""
        if not isinstance(self.exe, str) or not self.exe.strip():
            raise JobError("the executable must be a non-empty string", fqid=fqid, field="application.exe")
        if isinstance(self.args, (str, bytes)) or not isinstance(self.args, (list, tuple)):
            raise JobError(f"args must be a list, not {type(self.args).__name__}", fqid=fqid, field="application.args")
        clean: list[str] = []
        for i, arg in enumerate(self.args):
            if isinstance(arg, bool) or not isinstance(arg, (str, int, float)):
                raise JobError(f"argument {i} is a {type(arg).__name__}, not a string", fqid=fqid,
                               field="application.args")
            clean.append(str(arg))
        self.args = clean
        if not isinstance(self.env, Mapping):
            raise JobError("env must be a mapping of names to strings", fqid=fqid, field="application.env")
        for key, value in self.env.items():
            if not isinstance(key, str) or not key.isidentifier():
                raise JobError(f"{key!r} is not a valid environment variable name", fqid=fqid,
                               field="application.env")
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise JobError(f"the value of {key} must be a string", fqid=fqid, field="application.env")
        self.env = {k: str(v) for k, v in self.env.items()}
        self.check_size(fqid, exec_limit)

    def check_size(self, fqid: str, exec_limit: int | None) -> None:
        for i, arg in enumerate(self.args):
            if len(arg.encode()) >= MAX_ARG_STRLEN:
                raise JobError(f"argument {i} is {len(arg.encode())} bytes long; the system allows at most "
                               f"{MAX_ARG_STRLEN - 1} bytes in one argument", fqid=fqid, field="application.args")
        for key, value in self.env.items():
            if len(key.encode()) + len(value.encode()) + 1 >= MAX_ARG_STRLEN:
                raise JobError(f"{key} is longer than the system allows for one variable "
                               f"({MAX_ARG_STRLEN - 1} bytes)", fqid=fqid, field="application.env")
        if exec_limit is not None:
            size = exec_size(self.exe, self.args, self.env)
            if size > exec_limit:
                raise JobError(f"the arguments and environment take {size} bytes; the system allows "
                               f"{exec_limit} (ARG_MAX, less the wrapper's own environment)", fqid=fqid,
                               field="application.args")

    def to_dict(self) -> dict[str, Any]:
        return {"type": "Executable", "exe": self.exe, "args": list(self.args), "env": dict(self.env)}

    def copy(self) -> Executable:
        return Executable(self.exe, plain_copy(self.args), plain_copy(self.env))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Executable:
        return cls(exe=data["exe"], args=list(data.get("args", [])), env=dict(data.get("env", {})))


class Backend:
    """A backend's registered name and its settings.

    ``Backend("ssh", host="h", port=22)``; settings read and write as
    attributes (``b.port``), so a splitter may vary them per subjob with a
    dotted path such as ``"backend.mem"``.
    """

    __slots__ = ("name", "settings")
    name: str
    settings: dict[str, Any]

    def __init__(self, name: str, **settings: Any) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "settings", dict(settings))

    def __getattr__(self, key: str) -> Any:
        try:
            return self.settings[key]
        except KeyError:
            raise AttributeError(f"backend {self.name!r} has no setting {key!r}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        if key in ("name", "settings"):
            object.__setattr__(self, key, value)
        else:
            self.settings[key] = value

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return self.name == other
        return isinstance(other, Backend) and self.name == other.name and bool(self.settings == other.settings)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        items = "".join(f", {k}={v!r}" for k, v in self.settings.items())
        return f"Backend({self.name!r}{items})"

    def copy(self) -> Backend:
        return Backend(self.name, **plain_copy(self.settings))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "settings": plain_copy(self.settings)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Backend:
        return cls(data["name"], **data.get("settings", {}))

    @classmethod
    def coerce(cls, value: str | Backend | None, fqid: str) -> Backend:
        if value is None:
            return cls("local")
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, Backend):
            return value
        raise JobError(f"backend must be a name or Backend(...), not {type(value).__name__}", fqid=fqid,
                       field="backend")


@dataclass
class RetryPolicy:
    """Bounds on automatic retries (GBS); ``None`` takes the configured default.

    All zeros turns automatic retries off.
    """

    max_early: int | None = None
    max_late_handled: int | None = None
    max_late_unhandled: int | None = None
    early_seconds: float | None = None
    #: Retries of the infrastructure's faults, counted apart from the three limits above (negative: each
    #: verdict's as many as its limit allows); see ``max_infrastructure`` in the settings.
    max_infrastructure: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"max_early": self.max_early, "max_late_handled": self.max_late_handled,
                "max_late_unhandled": self.max_late_unhandled, "early_seconds": self.early_seconds,
                "max_infrastructure": self.max_infrastructure}

    def copy(self) -> RetryPolicy:
        return RetryPolicy(**self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> RetryPolicy:
        return cls(**dict(data or {}))

    def validate(self, fqid: str) -> None:
        for name in ("max_early", "max_late_handled", "max_late_unhandled", "early_seconds"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise JobError(f"must be a number >= 0, not {value!r}", fqid=fqid, field=f"retry.{name}")
        value = self.max_infrastructure
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise JobError(f"must be a whole number (negative: as the three limits), not {value!r}", fqid=fqid,
                           field="retry.max_infrastructure")


#: :meth:`JobInfo.to_dict`'s keys, in their order (the stored and ``show --json`` form).
_INFO_ORDER = ("submit_counter", "timestamps", *RunRecord.__dataclass_fields__, "partition")


@dataclass
class JobInfo(RunRecord):
    """Counters, timestamps and reasons; stored with the job, kept across reopen.

    The fields a run records (``reason``, ``history``, ``counters``, ``retry_args``, ``outputs``,
    ``refused``, ``checkpoint``) are :class:`~orchestrator.core.table.RunRecord`'s, so the job's view
    and the run's record cannot drift apart.
    """

    submit_counter: int = 0
    #: Seconds since the epoch at which the job last entered each status
    #: (plus ``final``). A master's start times are its earliest subjob's.
    timestamps: dict[str, float] = field(default_factory=dict)
    #: Pre-job / aggregator links: on a master ``prejob``, ``aggregator`` (job ids) and
    #: ``phase``; on those jobs ``master`` and ``role``. See :mod:`orchestrator.core.partition`.
    partition: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Every field, the counter and the times first, as the job's info has always been listed."""
        return {name: plain_copy(getattr(self, name)) for name in _INFO_ORDER}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> JobInfo:
        known = {k: v for k, v in dict(data or {}).items() if k in cls.__dataclass_fields__}
        return cls(**known)
