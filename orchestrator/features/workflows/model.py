"""The DØ job definition as plain data: Workflow → Stage → Line → Package → Binary.

A workflow (the seed's "job", renamed because a :class:`~orchestrator.Job` is
something else here) is stages of lines of packages of binaries. Nothing in
it names a dependency: a package waits for the packages that produce its
input files, matched by file name (see :mod:`.dag`). A package is the unit
that is scheduled, restarted and killed; its binaries run in sequence inside
it. Files are plain names in the workflow's shared data directory.

Every class has ``to_dict`` / ``from_dict``; the dict form is the TOML form
(singular table names: ``stage``, ``line``, ``package``, ``binary``), so a
stored definition and a workflow file are read by the same code, with the
same errors. Ids default to positions (``"1"``, ``"2"``, ...) and address a
package as ``"STAGE.LINE.PACKAGE"``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ...core.errors import OrchestratorError
from ...core.model import Backend, RetryPolicy
from . import values as V
from .values import check_file_name

#: A file a consumer no longer needs: kept for ever, kept until the cache needs room, deleted at once.
DISPOSITIONS = ("retain", "temporary", "deletable")
#: How an input with a locator reaches the data dir: a symlink, a copy when its first consumer
#: starts, or a copy when the workflow is submitted.
ACQUISITIONS = ("none", "copy", "prefetch")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*$")
#: Workflow ids name a directory of the home.
_WF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


@dataclass
class FileSpec:
    """One input or output file of a binary, by name (the DØ "base name").

    Inputs: ``locator`` (where a file nobody in the workflow produces is found),
    ``size``, ``acquisition`` (see :data:`ACQUISITIONS`) and ``disposition``
    (see :data:`DISPOSITIONS`; default ``retain``). Outputs: ``estimated_size``,
    and ``disposition`` for a file no package consumes (default ``retain``).
    """

    name: str
    locator: str | None = None
    size: int | None = None
    acquisition: str = "none"
    disposition: str | None = None
    estimated_size: int | None = None

    def check(self, where: str) -> None:
        check_file_name(self.name, f"{where}.name")
        if self.locator is not None:
            V.string(self.locator, f"{where}.locator", empty=False)
        for key in ("size", "estimated_size"):
            if getattr(self, key) is not None:
                V.integer(getattr(self, key), f"{where}.{key}", minimum=0)
        if self.acquisition not in ACQUISITIONS:
            raise V.fail(f"acquisition must be one of {ACQUISITIONS}, not {self.acquisition!r}", f"{where}.acquisition")
        if self.disposition is not None and self.disposition not in DISPOSITIONS:
            raise V.fail(f"disposition must be one of {DISPOSITIONS}, not {self.disposition!r}", f"{where}.disposition")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        for key in ("locator", "size", "disposition", "estimated_size"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.acquisition != "none":
            out["acquisition"] = self.acquisition
        return out

    @classmethod
    def coerce(cls, value: Any, where: str) -> FileSpec:
        """A ``FileSpec``, a bare name, or a table with the fields above."""
        if isinstance(value, FileSpec):
            spec = replace(value)
        elif isinstance(value, str):
            spec = cls(value)
        else:
            data = V.table(value, where)
            V.check_keys(data, ("name", "locator", "size", "acquisition", "disposition", "estimated_size"), where)
            if "name" not in data:
                raise V.fail("a file needs a name", f"{where}.name")
            spec = cls(**dict(data))
        spec.check(where)
        return spec


@dataclass
class Binary:
    """One executable run inside a package: ``executable args...`` in the data dir.

    ``name`` and ``version`` are the seed's software id and version (shown, not
    interpreted). The binary sees ``ORCH_INPUTS`` and ``ORCH_OUTPUTS`` (space
    separated names; inputs dropped by a killed line are left out).
    """

    executable: str
    args: list[str] = field(default_factory=list)
    inputs: list[FileSpec] = field(default_factory=list)
    outputs: list[FileSpec] = field(default_factory=list)
    name: str = ""
    version: str = ""
    env: dict[str, str] = field(default_factory=dict)
    estimated_run_time: float | None = None

    KEYS = ("executable", "args", "inputs", "outputs", "name", "version", "env", "estimated_run_time")

    def __post_init__(self) -> None:
        # A bare name is a file: ``Binary(exe, inputs=["a.dat"])`` reads as it should. The rest is judged by check().
        if isinstance(self.inputs, list):
            self.inputs = [FileSpec(f) if isinstance(f, str) else f for f in self.inputs]
        if isinstance(self.outputs, list):
            self.outputs = [FileSpec(f) if isinstance(f, str) else f for f in self.outputs]

    def check(self, where: str) -> None:
        V.string(self.executable, f"{where}.executable", empty=False)
        self.args = [str(a) if isinstance(a, (int, float)) and not isinstance(a, bool) else V.string(a, f"{where}.args")
                     for a in V.array(self.args, f"{where}.args")]
        self.inputs = [FileSpec.coerce(f, f"{where}.inputs[{i}]") for i, f in enumerate(V.array(self.inputs,
                                                                                               f"{where}.inputs"))]
        self.outputs = [FileSpec.coerce(f, f"{where}.outputs[{i}]")
                        for i, f in enumerate(V.array(self.outputs, f"{where}.outputs"))]
        for i, f in enumerate(self.outputs):
            if f.locator is not None or f.acquisition != "none":
                raise V.fail(f"output {f.name!r} takes no locator or acquisition", f"{where}.outputs[{i}]", f.name)
        V.string(self.name, f"{where}.name")
        V.string(self.version, f"{where}.version")
        env = V.table(self.env, f"{where}.env")
        for key, value in env.items():
            if not isinstance(key, str) or not key.replace("_", "a").isalnum() or key[0].isdigit():
                raise V.fail(f"{key!r} is not a valid environment variable name", f"{where}.env")
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise V.fail(f"the value of {key} must be a string", f"{where}.env")
        self.env = {k: str(v) for k, v in env.items()}
        self.estimated_run_time = V.number(self.estimated_run_time, f"{where}.estimated_run_time")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"executable": self.executable, "args": list(self.args),
                               "inputs": [_file_dict(f) for f in self.inputs],
                               "outputs": [_file_dict(f) for f in self.outputs]}
        for key in ("name", "version", "env", "estimated_run_time"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "binary") -> Binary:
        data = V.table(data, where)
        V.check_keys(data, cls.KEYS, where)
        if "executable" not in data:
            raise V.fail("a binary needs an executable", f"{where}.executable")
        b = cls(**dict(data))
        b.check(where)
        return b


def _file_dict(f: Any) -> Any:
    """A file as a dict; anything that is not a ``FileSpec`` is left for ``from_dict`` to judge."""
    return f.to_dict() if isinstance(f, FileSpec) else {"name": f} if isinstance(f, str) else f


@dataclass
class Package:
    """The unit that is scheduled, restarted and killed; its binaries run in sequence.

    ``nodes`` is the node restriction list (on ``local`` it must name this host
    or ``localhost``; in a DAGMan export it becomes ``requirements``). The
    failure history is the package job's (``job.info.history``).
    """

    binaries: list[Binary]
    id: str | None = None
    priority: int = 0
    hold: bool = False
    nodes: list[str] = field(default_factory=list)
    estimated_run_time: float | None = None
    backend: str | Backend | None = None
    retry: RetryPolicy | None = None

    KEYS = ("binary", "id", "priority", "hold", "nodes", "estimated_run_time", "backend", "retry")

    @property
    def estimate(self) -> float | None:
        """Its own estimate, else the sum of its binaries' (when they all have one)."""
        if self.estimated_run_time is not None:
            return self.estimated_run_time
        parts = [b.estimated_run_time for b in self.binaries]
        return sum(p for p in parts if p is not None) if parts and None not in parts else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "priority": self.priority, "hold": self.hold,
                               "binary": [b.to_dict() for b in self.binaries]}
        if self.nodes:
            out["nodes"] = list(self.nodes)
        if self.estimated_run_time is not None:
            out["estimated_run_time"] = self.estimated_run_time
        if isinstance(self.backend, Backend):
            out["backend"] = V.backend_dict(self.backend)
        elif self.backend is not None:
            out["backend"] = self.backend
        if self.retry is not None:
            out["retry"] = {k: v for k, v in self.retry.to_dict().items() if v is not None}
        return out

    @classmethod
    def from_dict(cls, data: Any, where: str = "package") -> Package:
        data = dict(V.table(data, where))
        V.check_keys(data, cls.KEYS, where)
        binaries = [Binary.from_dict(b, f"{where}.binary[{i}]")
                    for i, b in enumerate(V.array(data.pop("binary", []), f"{where}.binary"))]
        return cls(binaries=binaries, backend=V.backend(data.pop("backend", None), f"{where}.backend"),
                   retry=V.retry(data.pop("retry", None), f"{where}.retry"), **data)


@dataclass
class Line:
    """A line of packages (the seed's chain); ``early_start``: its packages start once their
    producers have *started* (running or beyond), not completed."""

    packages: list[Package]
    id: str | None = None
    early_start: bool = False
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "early_start": self.early_start, "name": self.name,
                "package": [p.to_dict() for p in self.packages]}

    @classmethod
    def from_dict(cls, data: Any, where: str = "line") -> Line:
        data = dict(V.table(data, where))
        V.check_keys(data, ("package", "binary", "id", "early_start", "name"), where)
        if "binary" in data:  # shorthand: a line of one package, given by its binaries
            if "package" in data:
                raise V.fail("give either package tables or binary tables, not both", f"{where}.binary")
            data["package"] = [{"binary": data.pop("binary")}]
        packages = [Package.from_dict(p, f"{where}.package[{i}]")
                    for i, p in enumerate(V.array(data.pop("package", []), f"{where}.package"))]
        return cls(packages=packages, **data)


@dataclass
class Stage:
    """A stage: lines that belong together (the stage orders nothing; files do)."""

    lines: list[Line]
    id: str | None = None
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "line": [ln.to_dict() for ln in self.lines]}

    @classmethod
    def from_dict(cls, data: Any, where: str = "stage") -> Stage:
        data = dict(V.table(data, where))
        V.check_keys(data, ("line", "id", "name"), where)
        lines = [Line.from_dict(ln, f"{where}.line[{i}]")
                 for i, ln in enumerate(V.array(data.pop("line", []), f"{where}.line"))]
        return cls(lines=lines, **data)


@dataclass
class Workflow:
    """The whole definition: the seed's job record and its stages.

    ``slots`` bounds the packages of this workflow that run at once (``None``:
    only the ``[workflow] slots`` setting bounds them); ``backend`` and
    ``retry`` are the defaults of packages that set none.
    """

    stages: list[Stage]
    id: str | None = None
    originator: str = ""
    priority: int = 0
    hold: bool = False
    slots: int | None = None
    backend: str | Backend = "local"
    retry: RetryPolicy | None = None
    created: float | None = None

    KEYS = ("stage", "id", "originator", "priority", "hold", "slots", "backend", "retry", "created")

    def packages(self) -> list[tuple[str, Stage, Line, Package]]:
        """Every package with its key ``STAGE.LINE.PACKAGE``, in definition order (ids must be set)."""
        return [(f"{s.id}.{ln.id}.{p.id}", s, ln, p) for s in self.stages for ln in s.lines for p in ln.packages]

    def normalized(self) -> Workflow:
        """A checked copy with every id set (positions by default) and every value coerced."""
        wf = Workflow.from_dict(self.to_dict())
        if wf.id is not None and not _WF_ID.match(wf.id):
            raise V.fail(f"a workflow id is letters, digits, '_', '.', '-' (a directory name), not {wf.id!r}", "id")
        V.string(wf.originator, "originator")
        V.integer(wf.priority, "priority")
        if not isinstance(wf.hold, bool):
            raise V.fail("must be true or false", "hold")
        if wf.slots is not None:
            V.integer(wf.slots, "slots", minimum=0)
        if wf.retry is not None:
            try:
                wf.retry.validate("workflow")
            except OrchestratorError as exc:
                raise V.fail(str(exc), "retry") from None
        wf.created = time.time() if wf.created is None else V.number(wf.created, "created")
        if not wf.stages:
            raise V.fail("a workflow needs at least one stage", "stage")
        for where, items in _levels(wf):
            seen: set[str] = set()
            for i, item in enumerate(items):
                item.id = _ident(item.id, i, f"{where}[{i}].id")
                if item.id in seen:
                    raise V.fail(f"two items have the id {item.id!r}", f"{where}[{i}].id")
                seen.add(item.id)
        for si, s in enumerate(wf.stages):
            if not s.lines:
                raise V.fail("a stage needs at least one line", f"stage[{si}].line")
            V.string(s.name, f"stage[{si}].name")
            for li, ln in enumerate(s.lines):
                if not ln.packages:
                    raise V.fail("a line needs at least one package", f"stage[{si}].line[{li}].package")
                if not isinstance(ln.early_start, bool):
                    raise V.fail("must be true or false", f"stage[{si}].line[{li}].early_start")
                V.string(ln.name, f"stage[{si}].line[{li}].name")
                for pi, p in enumerate(ln.packages):
                    _check_package(p, f"stage[{si}].line[{li}].package[{pi}]")
        return wf

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "originator": self.originator, "priority": self.priority,
                               "hold": self.hold, "stage": [s.to_dict() for s in self.stages]}
        if self.slots is not None:
            out["slots"] = self.slots
        out["backend"] = V.backend_dict(self.backend) if isinstance(self.backend, Backend) else self.backend
        if self.retry is not None:
            out["retry"] = {k: v for k, v in self.retry.to_dict().items() if v is not None}
        if self.created is not None:
            out["created"] = self.created
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Workflow:
        data = dict(V.table(data, ""))
        V.check_keys(data, cls.KEYS, "")
        stages = [Stage.from_dict(s, f"stage[{i}]") for i, s in enumerate(V.array(data.pop("stage", []), "stage"))]
        backend = V.backend(data.pop("backend", "local"), "backend") or Backend("local")
        return cls(stages=stages, backend=backend, retry=V.retry(data.pop("retry", None), "retry"), **data)


def _levels(wf: Workflow) -> list[tuple[str, list[Any]]]:
    out: list[tuple[str, list[Any]]] = [("stage", wf.stages)]
    for si, s in enumerate(wf.stages):
        out.append((f"stage[{si}].line", s.lines))
        for li, ln in enumerate(s.lines):
            out.append((f"stage[{si}].line[{li}].package", ln.packages))
    return out


def _ident(value: Any, index: int, where: str) -> str:
    if value is None:
        return str(index + 1)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not _ID.match(value):
        raise V.fail(f"an id is letters, digits and '-', not {value!r}", where)
    return value


def _check_package(p: Package, where: str) -> None:
    V.integer(p.priority, f"{where}.priority")
    if not isinstance(p.hold, bool):
        raise V.fail("must be true or false", f"{where}.hold")
    p.nodes = [V.string(n, f"{where}.nodes", empty=False) for n in V.array(p.nodes, f"{where}.nodes")]
    p.estimated_run_time = V.number(p.estimated_run_time, f"{where}.estimated_run_time")
    if not p.binaries:
        raise V.fail("a package needs at least one binary", f"{where}.binary")
    if p.retry is not None:
        try:
            p.retry.validate(where)
        except OrchestratorError as exc:
            raise V.fail(str(exc), f"{where}.retry") from None
