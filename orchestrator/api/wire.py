"""The service's requests on the wire: one typed request per control method, checked at the boundary.

Every request body (and query, for a ``GET``) is decoded into one of these
:class:`msgspec.Struct` types before anything else runs
(:func:`decode`): an unknown or mistyped field, a string too long, a value
nested too deeply is a :class:`BadRequest` naming the field's path, which
the service answers with 400, and nothing of such a request is stored. The
client side (:mod:`.remote`) builds its requests from the same types, so
both ends agree on them, and the service's OpenAPI document is generated
from them (:func:`openapi`).

A job travels as its public definition (:class:`JobSpec`: what
``Job(...).spec()`` gives, the fields a user sets), never as internal
structures; the service builds the job from it and checks it as
``orch.jobs.add()`` does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal, overload

import msgspec
from msgspec import Meta, Struct

from ..core.errors import JobError
from ..core.ids import FQID, fqid_str, parse_fqid

#: Deepest nesting of a free-form value (metadata, a backend's settings, a plugin's parameters).
MAX_DEPTH = 32
#: Most items of a list of job ids or indexes (a slice of a million subjobs is one request).
MAX_ITEMS = 2_000_000

Fqid = Annotated[str, Meta(min_length=1, max_length=100, description="a job id: '3', or '3.1' for a subjob")]
JobId = Annotated[int, Meta(ge=0, le=2**53, description="a top-level job's id")]
Index = Annotated[int, Meta(ge=0, le=2**53)]
Name = Annotated[str, Meta(max_length=1024)]
Text = Annotated[str, Meta(max_length=1 << 20)]
FileName = Annotated[str, Meta(min_length=1, max_length=255, pattern="^(?!\\.\\.?$)[^/\\x00]+$",
                               description="a file of the run's directory: not '.' or '..', no '/', no NUL, at most "
                                           "255 characters")]
FilePath = Annotated[str, Meta(max_length=4096)]
Count = Annotated[int, Meta(ge=0, le=2**31)]
Limit = Annotated[int, Meta(ge=-(2**31), le=2**31)]
Seconds = Annotated[float, Meta(ge=0, le=1e9)]
#: A sequence, not a list, so that a request made in this process may carry :class:`Fqids` (the JSON is a list).
Targets = Annotated[Sequence[Fqid], Meta(max_length=MAX_ITEMS)]
StatusName = Literal["new", "submitting", "submitted", "running", "completing", "completed", "failed", "killed",
                     "held"]
Free = dict[Annotated[str, Meta(max_length=1024)], Any]


class BadRequest(JobError):
    """A request that does not fit its method's type: the service answers 400 naming the field (a
    ``JobError``: its message names the job and the field as any other)."""

    @classmethod
    def answered(cls, message: str, *, fqid: str | None, field: str | None) -> BadRequest:
        """The service's 400 on the client's side: its message as it is, its ``fqid`` and ``field``."""
        error = cls("")
        error.args = (message,)
        error.fqid, error.field = fqid, field
        return error


class Request(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """Base of every request type."""


class Fqids(Sequence[str]):
    """The jobs a request names: fqid strings on the wire, id tuples in this process.

    The API names jobs by tuple (``(3, 1)``); a slice of a million subjobs
    would take seconds to turn into strings and back. So a request made in
    this process carries its jobs as an ``Fqids``: it *is* a sequence of
    fqid strings (each made only when read, as the remote transport does when
    it encodes the request), and a handler in this process takes the tuples
    as they are (:func:`fqs`).
    """

    __slots__ = ("tuples",)

    def __init__(self, tuples: Sequence[FQID]) -> None:
        self.tuples = tuples

    def __len__(self) -> int:
        return len(self.tuples)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        if isinstance(i, slice):
            return Fqids(self.tuples[i])
        return fqid_str(self.tuples[i])

    def __iter__(self) -> Iterator[str]:
        return map(fqid_str, self.tuples)

    def __repr__(self) -> str:
        return f"Fqids({len(self.tuples)} jobs)"


def fqs(named: Sequence[str] | None) -> Sequence[FQID]:
    """The id tuples of the jobs a request names: an :class:`Fqids`' own, or parsed from the strings."""
    if named is None:
        return ()
    if isinstance(named, Fqids):
        return named.tuples
    return [parse_fqid(f) for f in named]


# ------------------------------------------------------------------ a job's public definition
class ApplicationSpec(Request):
    """``Executable(exe, args, env)``."""

    exe: Annotated[str, Meta(max_length=4096)]
    args: Annotated[list[Annotated[str, Meta(max_length=1 << 20)] | int | float], Meta(max_length=1 << 16)] = []
    env: dict[Annotated[str, Meta(max_length=1024)], Annotated[str, Meta(max_length=1 << 20)] | int | float] = {}
    type: Literal["Executable"] = "Executable"


class BackendSpec(Request):
    """A backend's registered name and its settings (checked by its driver)."""

    name: Annotated[str, Meta(min_length=1, max_length=100)]
    settings: Free = {}


class PluginSpec(Request):
    """A splitter or a postprocessor: its entry-point name and its parameters."""

    plugin: Annotated[str, Meta(min_length=1, max_length=100)]
    params: Free = {}


class RetrySpec(Request):
    max_early: Limit | None = None
    max_late_handled: Limit | None = None
    max_late_unhandled: Limit | None = None
    early_seconds: Seconds | None = None
    max_infrastructure: Limit | None = None


class LinkedSpec(Request):
    """A pre-job or an aggregator: its name and definition."""

    name: Name
    spec: JobSpec


class JobSpec(Request):
    """A job's definition as ``Job(...).spec()`` gives it (see :mod:`orchestrator.api.definition`)."""

    application: ApplicationSpec
    backend: BackendSpec
    inputfiles: Annotated[list[FilePath], Meta(max_length=1 << 20)] = []
    outputfiles: Annotated[list[FilePath], Meta(max_length=1 << 16)] = []
    retry: RetrySpec | None = None
    mode: Literal["test", "production"] = "production"
    splitter: PluginSpec | None = None
    merger: PluginSpec | None = None
    postprocessors: Annotated[list[PluginSpec], Meta(max_length=100)] = []
    steps: Annotated[str, Meta(max_length=1024)] | Annotated[list[str | int], Meta(max_length=1 << 22)] | None = None
    step_weights: Annotated[list[float], Meta(max_length=1 << 22)] | None = None
    prejob: LinkedSpec | None = None
    aggregator: LinkedSpec | None = None
    min_success: Annotated[float, Meta(ge=0, le=1)] = 1.0
    comment: Text = ""
    metadata: Free = {}
    fail_on_missing_output: bool | None = None


class JobDefinition(Request):
    """A new job as it is defined now (name and definition), sent with its submission."""

    name: Name
    spec: JobSpec


# ------------------------------------------------------------------ reads
class JobsRequest(Request):
    status: Annotated[list[StatusName], Meta(max_length=16)] | None = None
    name: Name | None = None
    owner: Name | None = None


class ShowRequest(Request):
    fqid: Fqid
    subjobs: Count = 50


class MasterRequest(Request):
    fqid: Fqid
    failures: Count = 5000
    points: Annotated[int, Meta(ge=1, le=100_000)] = 400


class HealthRequest(Request):
    pass


class DescribeRequest(Request):
    jobs: Annotated[list[JobId], Meta(max_length=MAX_ITEMS)] | None = None


class InfoRequest(Request):
    fqid: Fqid


class InfosRequest(Request):
    fqids: Targets


class BackendIdRequest(Request):
    fqid: Fqid


class SubjobSpecsRequest(Request):
    job: JobId
    indexes: Annotated[list[Index], Meta(max_length=MAX_ITEMS)]


class SplitterSpecRequest(Request):
    job: JobId


class PeekRequest(Request):
    fqid: Fqid
    name: FileName = "stdout"
    tail: Count | None = None


class MetricsRequest(Request):
    pass


class StatesRequest(Request):
    fqid: Fqid


class StoryRequest(Request):
    fqid: Fqid


class OwnerRequest(Request):
    job: JobId


# ------------------------------------------------------------------ operations
class _TargetsRequest(Request):
    """Base of the operations that take their jobs (``targets``, or one ``fqid``) and ``keep_going``, and nothing
    else: ``kill`` and ``remove`` (they keep no docstring of their own: the OpenAPI summary would be made of it)."""

    targets: Targets | None = None
    keep_going: bool = False
    fqid: Fqid | None = None


class AddRequest(Request):
    name: Name
    spec: JobSpec


class SubmitRequest(Request):
    targets: Targets | None = None
    keep_going: bool = False
    #: New jobs as they are defined now, by id (each one of the targets).
    definitions: dict[Annotated[str, Meta(pattern="^[0-9]{1,15}$")], JobDefinition] | None = None
    fqid: Fqid | None = None


class KillRequest(_TargetsRequest):
    pass


class ResubmitRequest(Request):
    targets: Targets | None = None
    only_failed: bool = True
    keep_going: bool = False
    backend: BackendSpec | None = None
    from_state: Annotated[str, Meta(max_length=1 << 24)] | None = None
    fqid: Fqid | None = None


class ReleaseRequest(Request):
    targets: Targets | None = None
    retry_args: Annotated[list[Annotated[str, Meta(max_length=1 << 16)]], Meta(max_length=1000)] | None = None
    fqid: Fqid | None = None


class ForceStatusRequest(Request):
    targets: Targets | None = None
    status: StatusName = "failed"
    force: bool = False
    keep_going: bool = False
    fqid: Fqid | None = None


class RemoveRequest(_TargetsRequest):
    pass


class MergeRequest(Request):
    targets: Targets | None = None
    fqid: Fqid | None = None


class WaitRequest(Request):
    targets: Targets | None = None
    timeout: Seconds | None = None
    fqid: Fqid | None = None


class AnnotateRequest(Request):
    job: JobId
    comment: Text | None = None
    metadata: Free | None = None


class RefreshRequest(Request):
    pass


#: The requests that act on jobs named by ``targets`` (or one ``fqid``): what a service answers with the named
#: job's summary, and what a remote client reads again afterwards.
OPERATIONS = (SubmitRequest, KillRequest, ResubmitRequest, ReleaseRequest, ForceStatusRequest, RemoveRequest,
              MergeRequest, WaitRequest)

#: The request type of each control method.
REQUESTS: dict[str, type[Request]] = {
    "jobs": JobsRequest, "show": ShowRequest, "master": MasterRequest, "health": HealthRequest,
    "describe": DescribeRequest, "info": InfoRequest, "infos": InfosRequest, "backend_id": BackendIdRequest,
    "subjob_specs": SubjobSpecsRequest, "splitter_spec": SplitterSpecRequest, "peek": PeekRequest,
    "metrics": MetricsRequest, "states": StatesRequest, "story": StoryRequest, "owner": OwnerRequest, "add": AddRequest,
    "submit": SubmitRequest, "kill": KillRequest, "resubmit": ResubmitRequest, "release": ReleaseRequest,
    "force_status": ForceStatusRequest, "remove": RemoveRequest, "merge": MergeRequest,
    "wait": WaitRequest, "annotate": AnnotateRequest, "refresh": RefreshRequest,
}
METHOD_OF: dict[type[Request], str] = {cls: method for method, cls in REQUESTS.items()}


# ------------------------------------------------------------------ decoding
def decode(method: str, body: bytes) -> Request:
    """A ``POST`` body as ``method``'s request; :class:`BadRequest` naming the field otherwise."""
    if not body.strip():
        body = b"{}"
    try:
        raw = msgspec.json.decode(body)
    except RecursionError:
        raise BadRequest(f"the body is nested more than {MAX_DEPTH} levels deep") from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise BadRequest(f"the body must be a JSON object of arguments, not {_kind(raw)}")
    return convert(method, raw)


def decode_query(method: str, query: dict[str, list[str]]) -> Request:
    """A ``GET``'s query parameters as ``method``'s request (a list field takes every value, others the last)."""
    lists = list_fields(REQUESTS[method])
    return convert(method, {k: (v if k in lists else v[-1]) for k, v in query.items()}, strict=False)


def convert(method: str, raw: dict[str, Any], *, strict: bool = True) -> Request:
    """Arguments already parsed from JSON as ``method``'s request (see :func:`decode`)."""
    fqid = _fqid(raw)
    deep = _too_deep(raw)
    if deep is not None:
        raise BadRequest(f"nested more than {MAX_DEPTH} levels deep", fqid=fqid, field=deep)
    definitions = raw.get("definitions") if method == "submit" else None
    if isinstance(definitions, dict):  # each on its own, so that an error names the job (msgspec elides keys)
        for key, value in definitions.items():
            try:
                msgspec.convert(value, JobDefinition, strict=strict)
            except msgspec.ValidationError as exc:
                message, field = _explain(str(exc))
                raise BadRequest(f"{method}: {message}", fqid=str(key)[:100],
                                 field=".".join(p for p in ("definitions", str(key)[:100], field) if p)) from None
    try:
        return msgspec.convert(raw, REQUESTS[method], strict=strict)
    except msgspec.ValidationError as exc:
        message, field = _explain(str(exc))
        raise BadRequest(f"{method}: {message}", fqid=fqid, field=field) from None


def arguments(request: Request) -> dict[str, Any]:
    """A request's fields as plain JSON values, for the control method's keyword arguments."""
    return {f: msgspec.to_builtins(getattr(request, f)) for f in request.__struct_fields__}


def encode(request: Request) -> bytes:
    return msgspec.json.encode(request, enc_hook=_plain)


def _plain(value: Any) -> Any:
    if isinstance(value, Fqids):
        return list(value)
    raise NotImplementedError(f"not encodable: {type(value).__name__}")


def job_spec(spec: dict[str, Any], fqid: str) -> JobSpec:
    """A definition (``job.spec()``) as the wire's :class:`JobSpec`, checked here as the service checks it."""
    try:
        return msgspec.convert(spec, JobSpec)
    except msgspec.ValidationError as exc:
        message, field = _explain(str(exc))
        raise BadRequest(message, fqid=fqid, field=field) from None


def list_fields(cls: type[Request]) -> frozenset[str]:
    """The fields of a request type that hold a list."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    out = set()
    for f in info.fields:
        kinds = f.type.types if isinstance(f.type, msgspec.inspect.UnionType) else (f.type,)
        if any(isinstance(t, msgspec.inspect.ListType) for t in kinds):
            out.add(f.name)
    return frozenset(out)


def _explain(text: str) -> tuple[str, str | None]:
    """msgspec's ``Expected `int`, got `str` - at `$.a.b[0]``` as a message and the field's path ``a.b.0``."""
    message, sep, where = text.rpartition(" - at `")
    if not sep:
        message, where = text, "$`"
    for pattern, meaning in _PATTERNS.items():
        message = message.replace(f"matching regex {pattern!r}", meaning)
    where = where.rstrip("`")
    if where.startswith("key` in `"):
        where = where.removeprefix("key` in `")
    path = where.removeprefix("$").replace("[...]", "").replace("[", ".").replace("]", "").replace('"', "").strip(".")
    if "unknown field `" in message or "missing required field `" in message:
        name = message.split("field `", 1)[1].split("`", 1)[0]
        path = f"{path}.{name}" if path else name
    return message, path or None


#: What a pattern of the types means, for messages.
_PATTERNS = {"^[^/\\x00]+$": "naming a file of the job's directory (no '/', no NUL)",
             "^[0-9]{1,15}$": "that is a job id"}


def _too_deep(value: Any) -> str | None:
    """The path of a value nested more than :data:`MAX_DEPTH` levels deep, or ``None``."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            return path.strip(".") or None
        if isinstance(item, dict):
            stack.extend((v, depth + 1, f"{path}.{k}") for k, v in item.items() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend((v, depth + 1, f"{path}.{i}") for i, v in enumerate(item) if isinstance(v, (dict, list)))
    return None


def _fqid(raw: dict[str, Any]) -> str | None:
    """The job a request is about, when it names one: its ``fqid``, its one target, or its ``job``."""
    value = raw.get("fqid")
    targets = raw.get("targets")
    if value is None and isinstance(targets, list) and len(targets) == 1:
        value = targets[0]
    if value is None:
        value = raw.get("job")
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        return str(value)[:100]
    return None


def _kind(value: Any) -> str:
    return {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), "null")


__all__ = ["REQUESTS", "BadRequest", "Fqids", "JobSpec", "Request", "arguments", "convert", "decode", "decode_query",
           "encode", "fqs"]
