"""The service's HTTP routes: the control methods, the status stream, the status page, the health check.

- ``POST /api/<method>`` with the keyword arguments as a JSON object calls
  :class:`~orchestrator.service.control.Control` (``GET`` with query
  parameters for the read-only ones); errors come back as ``{"error",
  "message", "fqid", "field"}`` with 404 (unknown job), 409 (refused), 400
  (bad request), and 403 ``"not owner"`` (another user's job; with
  ``owner`` and ``user``).
- ``GET /api/events``: server-sent events: every event and every change, in
  order, encoded (:mod:`orchestrator.core.codec`) with ``seq``, the number
  of the step that made it.
- ``POST /api/workflow/<command>``: a workflow command (``orchestrator
  workflow ...``) run by the service on its workflows for the caller
  (:func:`orchestrator.features.workflows.cli.serve_command`): what it
  printed, and its exit code.
- ``GET /health``: 200 while the service runs.
- ``GET /``: the live status page.

Who may call (:mod:`.access`): on the Unix socket the owner's uid, and the
users the settings name (checked with ``SO_PEERCRED`` on every request); on
TCP only a client that shows a token (``Authorization: Bearer``, or the
cookie the page sets after ``/?token=...``): the owner's, or a user's. Each
request acts as its caller: a user sees and acts on their own jobs, the
stream of events included; an admin on all.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any

import anyio

from ..api.owners import Caller, visible_to
from ..core import codec
from ..core.errors import JobError, Lagging, NotOwnerError, OrchestratorError, UnknownJobError
from ..core.events import Event
from ..plugin.logs import get_logger
from ..runtime.bus import Bus
from .access import Access
from .control import METHODS, READ_ONLY, Control
from .http import Request, Response

log = get_logger(component="api")

#: Parameters that are lists when passed in a query string.
LIST_PARAMS = frozenset({"targets", "retry_args", "jobs", "indexes"})
COOKIE = "orch_token"
#: Seconds between two keep-alive comments on an idle event stream.
HEARTBEAT = 15.0
#: Runs a workflow command for a caller: ``(caller, command, arguments) -> {"out": [...], "code": int}``.
WorkflowHandler = Callable[[Caller, str, dict[str, Any]], Awaitable[dict[str, Any]]]
#: Prometheus's text exposition format.
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Api:
    def __init__(self, control: Control, bus: Bus, *, access: Access,
                 metrics: Callable[[], bytes] | None = None, workflows: WorkflowHandler | None = None) -> None:
        self.control = control
        self.workflows = workflows
        self.bus = bus
        self.metrics = metrics
        self.access = access

    async def __call__(self, req: Request) -> Response:
        if req.method == "GET" and req.path == "/" and "token" in req.query and req.via == "tcp":
            return self._login(req.query["token"][0])
        caller = self._caller(req)
        if isinstance(caller, Response):
            return caller
        return await self._route(req, self.control.as_caller(caller))

    async def _route(self, req: Request, control: Control) -> Response:
        if req.path in ("/", "/index.html") and req.method in ("GET", "HEAD"):
            return Response(200, _page(), "text/html; charset=utf-8")
        if req.path.startswith("/job/") and req.method in ("GET", "HEAD"):
            return Response(200, _page("job.html"), "text/html; charset=utf-8")
        if req.path.startswith("/peek/") and req.method == "GET":
            return await self._peek(control, req.path.removeprefix("/peek/"))
        if req.path == "/health" and req.method in ("GET", "HEAD"):
            return Response.json(await control.health())
        if req.path == "/metrics" and req.method == "GET" and self.metrics is not None:
            return Response(200, self.metrics(), METRICS_TYPE)
        if req.path == "/api/events" and req.method == "GET":
            return Response(200, content_type="text/event-stream", stream=self._events(control))
        if req.path.startswith("/api/workflow/") and req.method == "POST":
            return await self._workflow(req, control.t.caller, req.path.removeprefix("/api/workflow/"))
        if req.path.startswith("/api/"):
            return await self._call(req, control, req.path.removeprefix("/api/"))
        return _error(404, "not found", f"no route {req.method} {req.path}")

    # ------------------------------------------------------------ access
    def _caller(self, req: Request) -> Caller | Response:
        return caller_of(req, self.access)

    def _login(self, shown: str) -> Response:
        """``/?token=...`` from a browser: keep the token in a cookie and drop it from the address bar."""
        if self.access.by_token(shown) is None:
            return _error(401, "unauthorized", "wrong token")
        cookie = f"{COOKIE}={shown}; HttpOnly; SameSite=Strict; Path=/"
        return Response(303, b"", "text/plain", headers=[("location", "/"), ("set-cookie", cookie)])

    async def _peek(self, control: Control, rest: str) -> Response:
        """``/peek/3.1/stderr``: a run's file as text, for the links of a master's page."""
        fqid, _, name = rest.partition("/")
        try:
            answer = await control.peek(fqid, name or "stdout")
        except UnknownJobError as exc:
            return _error(404, "unknown job", str(exc), fqid=fqid)
        except NotOwnerError as exc:
            return _not_owner(exc)
        except JobError as exc:
            return _error(409, "refused", str(exc), fqid=fqid, field=exc.field)
        return Response(200, str(answer["text"]).encode(), "text/plain; charset=utf-8")

    # ------------------------------------------------------------ methods
    async def _call(self, req: Request, control: Control, method: str) -> Response:
        if method not in METHODS:
            return _error(404, "not found", f"no method {method!r}")
        if req.method == "GET" and method in READ_ONLY:
            kwargs: Any = {k: (v if k in LIST_PARAMS else v[-1]) for k, v in req.query.items()}
        elif req.method == "POST":
            try:
                kwargs = req.json()
            except (ValueError, UnicodeDecodeError) as exc:
                return _error(400, "bad request", f"the body is not JSON: {exc}")
            if not isinstance(kwargs, dict):
                return _error(400, "bad request", "the body must be a JSON object of arguments")
        else:
            return _error(405, "method not allowed", f"{req.method} /api/{method}")
        call = getattr(control, method)
        try:
            inspect.signature(call).bind(**kwargs)
        except TypeError as exc:  # arguments that do not fit the method (a TypeError inside it is a bug: 500)
            return _error(400, "bad request", f"{method}: {exc}")
        try:
            result = await call(**kwargs)
        except UnknownJobError as exc:
            return _error(404, "unknown job", str(exc), fqid=exc.fqid or _fqid(kwargs))
        except NotOwnerError as exc:
            return _not_owner(exc)
        except JobError as exc:
            return _error(409, "refused", str(exc), fqid=exc.fqid or _fqid(kwargs), field=exc.field)
        except OrchestratorError as exc:
            return _error(409, "refused", str(exc), fqid=_fqid(kwargs))
        return Response.json(result)

    async def _workflow(self, req: Request, caller: Caller, command: str) -> Response:
        """A workflow command, run here for ``caller`` on the service's workflows."""
        if self.workflows is None:
            return _error(404, "not found", "this service does not run workflows")
        try:
            kwargs = req.json()
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(400, "bad request", f"the body is not JSON: {exc}")
        if not isinstance(kwargs, dict):
            return _error(400, "bad request", "the body must be a JSON object of arguments")
        try:
            return Response.json(await self.workflows(caller, command, kwargs))
        except KeyError as exc:
            return _error(404, "not found", str(exc.args[0]) if exc.args else f"no workflow command {command!r}")
        except TypeError as exc:
            return _error(400, "bad request", f"workflow {command}: {exc}")
        except JobError as exc:
            return _error(409, "refused", str(exc), fqid=exc.fqid, field=exc.field)
        except OrchestratorError as exc:
            return _error(409, "refused", str(exc), field=getattr(exc, "field", None))

    async def _events(self, control: Control) -> AsyncIterator[bytes]:
        """Every event and change of the caller's jobs (all, for an admin), in order, until the client or the
        service goes."""
        visible = visible_to(control.t.caller, control.t.owners.owner)
        receive = self.bus.subscribe(numbered=True)
        with receive:
            yield b": events follow\n\n"
            while True:
                with anyio.move_on_after(HEARTBEAT) as idle:
                    try:
                        item = await receive.receive()
                    except anyio.EndOfStream:
                        return
                if idle.cancelled_caught:
                    yield b": idle\n\n"
                    continue
                if isinstance(item, Lagging):  # dropped: the client is told, then the stream ends
                    data = json.dumps({"error": "lagging", "message": str(item)})
                    yield f"event: lagging\ndata: {data}\n\n".encode()
                    return
                seq, event = item
                if isinstance(event, Event) and visible(event):
                    data = json.dumps({"seq": seq, **codec.encode(event)}, separators=(",", ":"), default=str)
                    yield f"data: {data}\n\n".encode()


def caller_of(req: Request, access: Access) -> Caller | Response:
    """Who sent this request (checked on every one, by the active service and a standby alike), or the
    answer that turns them away."""
    if req.via == "unix":
        caller = access.by_uid(req.peer_uid)
        if caller is None:
            log.warning("refused a client of the socket", uid=req.peer_uid, path=req.path)
            return _error(403, "forbidden", access.refusal(req.peer_uid))
        return caller
    shown = _bearer(req.headers.get("authorization", "")) or _cookie(req.headers.get("cookie", ""), COOKIE)
    caller = access.by_token(shown)
    if caller is None:
        response = _error(401, "unauthorized", "a bearer token is required (see the service's token file, "
                                               "or ask its owner for one: orchestrator token USER)")
        response.headers.append(("www-authenticate", 'Bearer realm="orchestrator"'))
        return response
    return caller


def _page(name: str = "page.html") -> bytes:
    return resources.files(__package__).joinpath(name).read_bytes()


def _error(status: int, error: str, message: str, *, fqid: str | None = None, field: str | None = None,
           **more: Any) -> Response:
    return Response.json({"error": error, "message": message, "fqid": fqid, "field": field, **more}, status)


def _not_owner(exc: NotOwnerError) -> Response:
    return _error(403, "not owner", str(exc), fqid=exc.fqid, owner=exc.owner, user=exc.user)


def _fqid(kwargs: Any) -> str | None:
    """The job a refused request was about: its ``fqid``, or its one target."""
    if not isinstance(kwargs, dict):
        return None
    value = kwargs.get("fqid")
    targets = kwargs.get("targets")
    if value is None and isinstance(targets, list) and len(targets) == 1:
        value = targets[0]
    if isinstance(value, list):  # a target written as [3, 1]
        value = ".".join(map(str, value))
    return str(value) if value is not None else None


def _bearer(value: str) -> str | None:
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _cookie(header: str, name: str) -> str | None:
    for part in header.split(";"):
        key, _, value = part.strip().partition("=")
        if key == name and value:
            return value
    return None
