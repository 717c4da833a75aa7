"""The emulated gLite WMS's wire protocol: small JSON documents over HTTP/1.1 on loopback.

Why HTTP and JSON: the real gLite WMS spoke SOAP over HTTPS; what matters
for the orchestrator is the shape of the conversation (submit a collection,
ask its status in one call, cancel in one call, submit a single node), not
the encoding. Plain HTTP/1.1 with one request per connection
(``Connection: close``) keeps both ends a few dozen lines on anyio streams,
needs no web framework, and makes a "reconnect" after a service restart
free: every call opens a fresh connection.

Endpoints (protocol version 1; every body is a JSON object, every answer is
``200`` with a JSON object, or ``4xx``/``5xx`` with ``{"error": "..."}``):

``GET /v1/ping``
    ``{"service": "orch-glite-wms", "protocol": 1, "pid": ..., "started": ..., "nodes": n}``
``POST /v1/collections``  ``{"request": RID, "nodes": [NODE, ...], "faults": FAULTS}``
    Submit a collection. Answer ``{"collection": CID, "nodes": [{"key": K, "node": NID | null,
    "collection": CID | null, "error": null | "why"}, ...]}``, one entry per node, in order; a node
    with an ``error`` was rejected and does not exist. A node whose ``key`` the service already knew
    is the earlier node, in its own collection: each entry names the collection that holds its node
    (ask that one for its status). ``CID`` is ``null`` when every node was rejected.
``POST /v1/nodes``  ``{"request": RID, "node": NODE, "faults": FAULTS}``
    Submit a single node (resubmission): a one-node collection of kind ``"node"``.
    Answer ``{"collection": CID | null, "node": NID | null, "error": null | "why"}``.
``GET /v1/collections/CID``
    Bulk status: ``{"collection": CID, "kind": "collection" | "node", "nodes": {NID: {"key": K,
    "index": i, "fqid": F, "state": STATE, "exit_code": int | null, "reason": str | null,
    "pid": int | null}}}``; ``404`` with ``"unknown collection ..."`` if the service does not know ``CID``.
``POST /v1/cancel``  ``{"nodes": [NID, ...]}``
    Bulk cancel, across collections. Answer ``{"nodes": {NID: {"state": STATE, "error": null | "why"}}}``.
    Cancelling a node that already ended is a no-op (its state is returned).
``POST /v1/lookup``  ``{"keys": [K, ...]}``
    Which runs the service got, by key (a client restarted after a crash asks about the runs it was
    submitting). Answer ``{"epoch": E, "nodes": {K: {"collection": CID, "node": NID} | null}}``. Each
    key answered ``null`` is fenced at the new epoch ``E``: a later submission of it must carry
    ``"epoch": E`` (or more), else its node is refused (``"voided: ..."``), so a submission still in
    flight from before the crash can never create it after the service said it had no such node.
``GET /v1/nodes/NID/output`` and ``GET /v1/nodes/NID/output/NAME``
    The names and sizes of a node's output files, and one file's bytes (``application/octet-stream``).
    The service writes each node's output into the ``outputdir`` of its run (the WMS shares the
    orchestrator's file system, as a site's WMS shares its storage element), so the ``glite``
    driver reads output there and needs no fetch; these exist for other clients and for tests.
``GET /v1/faults``, ``PUT /v1/faults``  ``FAULTS``
    The service-wide faults (also set at start with ``--faults``), read or replaced at run time.

Submissions may carry ``"epoch": E``, the highest epoch a lookup answered the client (default 0).

``RID`` is a request id chosen by the client, stable across retries: a request
repeated with the same ``RID`` gets the first answer again, and a node whose
``key`` the service already knows is never created twice, so a client may
retry a submission whose answer it lost without running anything twice.

``NODE`` is a serialised :class:`~orchestrator.RunSpec` (see :func:`node_spec`),
plus ``shell``. ``STATE`` is one of :data:`NODE_STATES`.

``FAULTS`` (all optional), per collection or service-wide::

    {"reject": [k, ...],            # nodes with index k are refused at submission
     "abort": {"k": seconds},       # node k is aborted that long after it was accepted
     "status_delay": seconds,       # every status answer comes that late
     "drop": {"submit": n, ...},    # the next n answers of that kind are never sent (connection closed;
                                    #   a submission is carried out first: its answer is what is lost)
     "garbage": {"status": n, ...}} # the next n answers of that kind are not JSON
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
from anyio.abc import ByteStream
from anyio.streams.buffered import BufferedByteReceiveStream

from orchestrator.plugin import RunSpec, SettingsError

PROTOCOL_VERSION = 1
SERVICE = "orch-glite-wms"
#: ``submitted``: accepted, waiting for a slot; ``launching``: about to be (or being) started;
#: ``running``: the wrapper started; ``done``: the wrapper ended (``exit_code``);
#: ``aborted``: the service gave up on it (``reason``); ``cancelled``: a client cancelled it.
NODE_STATES = ("submitted", "launching", "running", "done", "aborted", "cancelled")
FINAL_STATES = frozenset({"done", "aborted", "cancelled"})
#: Kinds of request that ``drop`` and ``garbage`` faults apply to.
FAULT_OPS = ("submit", "status", "cancel")
FAULT_KEYS = ("reject", "abort", "status_delay", "drop", "garbage")
#: Upper bounds that keep a confused peer from exhausting memory.
MAX_HEADER = 64 * 1024
MAX_BODY = 256 * 1024 * 1024


class WMSFault(Exception):
    """The service could not be used for this call; nothing is known about the runs concerned."""


class WMSUnavailable(WMSFault):
    """No answer: connection refused, reset, dropped, or timed out."""


class WMSGarbage(WMSFault):
    """An answer came, but it is not the protocol (bad HTTP, not JSON, wrong shape)."""


class WMSError(WMSFault):
    """The service answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


# ------------------------------------------------------------------ endpoints
def is_loopback(host: str) -> bool:
    """Only loopback is allowed: the emulator is a test service, never a network one."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_endpoint(url: str) -> tuple[str, int]:
    """``http://127.0.0.1:PORT`` → ``("127.0.0.1", PORT)``; ``ValueError`` unless it is loopback HTTP."""
    if not isinstance(url, str):
        raise ValueError(f"endpoint must be a string like 'http://127.0.0.1:PORT', not {url!r}")
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"endpoint must look like 'http://127.0.0.1:PORT', not {url!r}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None or not 0 < port < 65536:
        raise ValueError(f"endpoint {url!r} needs a port")
    if not is_loopback(parts.hostname):
        raise ValueError(f"endpoint {url!r} is not on loopback (the WMS emulator listens on loopback only)")
    return parts.hostname, port


def parse_listen(value: str) -> tuple[str, int]:
    """``127.0.0.1:PORT`` (``PORT`` may be 0: any free port) for the server; loopback only."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 <= int(port) < 65536:
        raise ValueError(f"--listen must be HOST:PORT, not {value!r}")
    if not is_loopback(host):
        raise ValueError(f"--listen {value!r}: the WMS emulator listens on loopback only")
    return host, int(port)


# ---------------------------------------------------------------- documents
def node_spec(run: RunSpec, shell: str = "/bin/sh") -> dict[str, Any]:
    """A run as the service receives it: everything ``prepare_local`` needs, as JSON."""
    return {
        "key": run.key, "fqid": run.fqid, "index": run.index, "attempt": run.attempt,
        "executable": run.executable, "args": list(run.args), "env": dict(run.env),
        "inputs": [str(p) for p in run.inputs], "outputfiles": list(run.outputfiles),
        "jobdir": str(run.jobdir), "inputdir": str(run.inputdir), "outputdir": str(run.outputdir),
        "workdir": str(run.workdir), "mode": run.mode, "retry_count": run.retry_count,
        "retry_args": list(run.retry_args), "shell": shell,
        **({"owner": run.owner} if run.owner is not None else {}),  # the user the WMS runs the node as
    }


def run_spec(node: Mapping[str, Any]) -> RunSpec:
    """The inverse of :func:`node_spec`; ``ValueError`` (naming the field) on a malformed node."""
    def text(name: str) -> str:
        value = node.get(name)
        if not isinstance(value, str) or not value:
            raise ValueError(f"node field {name!r} must be a non-empty string")
        return value

    def strings(name: str) -> tuple[str, ...]:
        value = node.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"node field {name!r} must be a list of strings")
        return tuple(value)

    def integer(name: str) -> int:
        value = node.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"node field {name!r} must be an integer >= 0")
        return value

    env = node.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("node field 'env' must map names to strings")
    for name in ("jobdir", "inputdir", "outputdir", "workdir"):
        if not Path(text(name)).is_absolute():
            raise ValueError(f"node field {name!r} must be an absolute path")
    return RunSpec(
        fqid=text("fqid"), index=integer("index"), attempt=integer("attempt"), key=text("key"),
        executable=text("executable"), args=strings("args"), env=env, settings={},
        inputs=tuple(Path(p) for p in strings("inputs")), outputfiles=strings("outputfiles"),
        jobdir=Path(text("jobdir")), inputdir=Path(text("inputdir")), outputdir=Path(text("outputdir")),
        workdir=Path(text("workdir")), mode=text("mode") if "mode" in node else "production",
        retry_count=integer("retry_count"), retry_args=strings("retry_args"),
        owner=text("owner") if node.get("owner") is not None else None,
    )


def _index(key: Any, field: str) -> int:
    try:
        index = int(key)
    except (TypeError, ValueError):
        raise SettingsError(field, f"{field}: {key!r} is not a subjob index") from None
    if isinstance(key, bool) or index < 0 or (isinstance(key, float) and key != index):
        raise SettingsError(field, f"{field}: {key!r} is not a subjob index")
    return index


def _seconds(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise SettingsError(field, f"{field} must be a number of seconds >= 0, not {value!r}")
    return float(value)


def _counts(value: Any, field: str) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise SettingsError(field, f"{field} must map a request kind ({', '.join(FAULT_OPS)}) to a count")
    out: dict[str, int] = {}
    for op, n in value.items():
        if op not in FAULT_OPS:
            raise SettingsError(field, f"{field}: {op!r} is not one of {', '.join(FAULT_OPS)}")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise SettingsError(field, f"{field}[{op!r}] must be a count >= 0, not {n!r}")
        out[op] = n
    return out


def check_faults(faults: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a ``FAULTS`` object; return it normalised (JSON-safe keys) or raise ``SettingsError``."""
    out: dict[str, Any] = {}
    for key in faults:
        if key not in FAULT_KEYS:
            raise SettingsError(key, f"unknown fault {key!r} (known: {', '.join(FAULT_KEYS)})")
    if "reject" in faults:
        value = faults["reject"]
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
            raise SettingsError("reject", f"reject must be a list of subjob indexes, not {value!r}")
        out["reject"] = sorted({_index(k, "reject") for k in value})
    if "abort" in faults:
        value = faults["abort"]
        if not isinstance(value, Mapping):
            raise SettingsError("abort", f"abort must map a subjob index to seconds, not {value!r}")
        out["abort"] = {str(_index(k, "abort")): _seconds(v, "abort") for k, v in value.items()}
    if "status_delay" in faults:
        out["status_delay"] = _seconds(faults["status_delay"], "status_delay")
    for key in ("drop", "garbage"):
        if key in faults:
            out[key] = _counts(faults[key], key)
    return out


# --------------------------------------------------------------------- HTTP
@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    body: bytes


async def read_request(stream: ByteStream) -> Request:
    """Read one HTTP/1.1 request; ``WMSGarbage`` if it is not one we understand."""
    buffered = BufferedByteReceiveStream(stream)
    try:
        head = await buffered.receive_until(b"\r\n\r\n", MAX_HEADER)
    except (anyio.DelimiterNotFound, anyio.IncompleteRead) as exc:
        raise WMSGarbage(f"no HTTP request head ({type(exc).__name__})") from None
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ")
    except ValueError:
        raise WMSGarbage(f"bad request line {lines[0][:80]!r}") from None
    if not version.startswith("HTTP/1."):
        raise WMSGarbage(f"not HTTP/1.x: {version[:20]!r}")
    headers = _headers(lines[1:])
    length = _length(headers)
    body = await buffered.receive_exactly(length) if length else b""
    return Request(method.upper(), target.split("?", 1)[0], body)


def _headers(lines: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise WMSGarbage(f"bad header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return headers


def _length(headers: Mapping[str, str]) -> int:
    raw = headers.get("content-length", "0")
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_BODY:
        raise WMSGarbage(f"bad Content-Length {raw[:20]!r}")
    return int(raw)


REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}


def response(status: int, body: bytes, content_type: str = "application/json") -> bytes:
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + body


def json_response(status: int, document: Any) -> bytes:
    return response(status, json.dumps(document, separators=(",", ":")).encode())


async def http_call(endpoint: str, method: str, path: str, document: Any = None, *,
                    timeout: float = 10.0) -> tuple[int, bytes]:
    """One HTTP exchange on a fresh connection: ``(status, body)``; ``WMSUnavailable``/``WMSGarbage`` else."""
    host, port = parse_endpoint(endpoint)
    body = b"" if document is None else json.dumps(document, separators=(",", ":")).encode()
    head = (f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("latin-1")
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(timeout):
            async with await anyio.connect_tcp(host, port) as stream:
                await stream.send(head + body)
                async for chunk in stream:
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_BODY + MAX_HEADER:
                        raise WMSGarbage("answer too large")
    except TimeoutError:
        raise WMSUnavailable(f"no answer from {endpoint} within {timeout:g} s") from None
    except (OSError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
        raise WMSUnavailable(f"{endpoint}: {type(exc).__name__}: {exc}") from None
    data = b"".join(chunks)
    if not data:
        raise WMSUnavailable(f"{endpoint} closed the connection without an answer")
    head_bytes, sep, payload = data.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    code = status_line[1] if len(status_line) > 1 else ""
    if not sep or not status_line[0].startswith("HTTP/1.") or not (code.isascii() and code.isdigit()):
        raise WMSGarbage(f"{endpoint} answered something that is not HTTP: {data[:60]!r}")
    length = _length(_headers(lines[1:]))
    if len(payload) < length:
        raise WMSUnavailable(f"{endpoint} closed the connection mid-answer ({len(payload)} of {length} bytes)")
    return int(code), payload[:length]


async def call(endpoint: str, method: str, path: str, document: Any = None, *, timeout: float = 10.0) -> Any:
    """A JSON call: the decoded answer object, or a :class:`WMSFault`."""
    status, payload = await http_call(endpoint, method, path, document, timeout=timeout)
    try:
        answer = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WMSGarbage(f"{method} {path}: the answer is not JSON: {payload[:60]!r}") from None
    if status != 200:
        message = answer.get("error") if isinstance(answer, dict) else None
        raise WMSError(status, str(message or payload[:200]))
    if not isinstance(answer, dict):
        raise WMSGarbage(f"{method} {path}: the answer is not a JSON object")
    return answer
