"""The service's HTTP routes: the control methods, the status stream, the status page, the health check.

- ``POST /api/<method>`` with the keyword arguments as a JSON object calls
  :class:`~orchestrator.service.control.Control` (``GET`` with query
  parameters for the read-only ones); errors come back as ``{"error",
  "message", "fqid", "field"}`` with 404 (unknown job), 409 (refused), 400
  (bad request), and 403 ``"not owner"`` (another user's job; with
  ``owner`` and ``user``).
- Every request is first decoded into its method's typed request
  (:mod:`orchestrator.api.wire`): one that does not fit answers 400 naming
  the field, before anything runs, so nothing of it is stored.
  ``GET /api/openapi.json`` describes them (:mod:`.openapi`).
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
TCP only a client that shows a token (``Authorization: Bearer``), or a
browser logged in with ``/?token=...`` (:mod:`.sessions`: a session cookie
and its CSRF token). Each request acts as its caller: a user sees and acts
on their own jobs, the stream of events included; an admin on all. An event
stream ends within :data:`RECHECK` seconds of its caller losing access.

A ``POST`` must be ``Content-Type: application/json`` and, when it names an
``Origin`` (a browser), come from the service's own; answers may not be framed
(``X-Frame-Options``, ``frame-ancestors``), and the pages run only their own
scripts (a content security policy with their hashes).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import cache
from importlib import resources
from typing import Any

import anyio

from ..api import wire
from ..api.owners import Caller, visible_to
from ..core import codec
from ..core.errors import JobError, Lagging, NotOwnerError, OrchestratorError, UnknownJobError
from ..core.events import Event
from ..plugin.logs import get_logger
from ..runtime.bus import Bus
from .access import Access
from .control import METHODS, READ_ONLY, Control
from .http import Request, Response
from .openapi import openapi_document

log = get_logger(component="api")

#: Seconds between two keep-alive comments on an idle event stream.
HEARTBEAT = 15.0
#: Seconds between two checks that an event stream's caller still has access.
RECHECK = 0.5
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
        if req.method == "GET" and _is_page(req.path) and "token" in req.query and req.via == "tcp":
            return self._login(req)
        refused = cross_site(req)
        if refused is not None:
            return refused
        caller = self._caller(req)
        if isinstance(caller, Response):
            return caller
        return await self._route(req, self.control.as_caller(caller))

    async def _route(self, req: Request, control: Control) -> Response:
        if req.path in ("/", "/index.html") and req.method in ("GET", "HEAD"):
            return _html("page.html")
        if req.path.startswith("/job/") and req.method in ("GET", "HEAD"):
            return _html("job.html")
        if req.path.startswith("/peek/") and req.method == "GET":
            return await self._peek(control, req.path.removeprefix("/peek/"))
        if req.path == "/health" and req.method in ("GET", "HEAD"):
            return Response.json(await control.health())
        if req.path == "/metrics" and req.method == "GET" and self.metrics is not None:
            return Response(200, self.metrics(), METRICS_TYPE)
        if req.path == "/api/events" and req.method == "GET":
            return Response(200, content_type="text/event-stream", stream=self._events(control, req))
        if req.path.startswith("/api/workflow/") and req.method == "POST":
            return await self._workflow(req, control.transport.caller, req.path.removeprefix("/api/workflow/"))
        if req.path.startswith("/api/"):
            return await self._call(req, control, req.path.removeprefix("/api/"))
        return _error(404, "not found", f"no route {req.method} {req.path}")

    # ------------------------------------------------------------ access
    def _caller(self, req: Request) -> Caller | Response:
        return caller_of(req, self.access)

    def _login(self, req: Request) -> Response:
        """``/?token=...`` (or ``/job/ID?token=...``) from a browser: a session in a cookie, its CSRF token in
        the address's fragment (the page keeps it and clears it), and the token gone from the address bar."""
        opened = self.access.login(req.query["token"][-1])
        if opened is None:
            return _error(401, "unauthorized", "wrong token")
        sid, csrf = opened
        lifetime = int(self.access.sessions.lifetime) if self.access.sessions is not None else 0
        cookie = f"{self.access.cookie}={sid}; HttpOnly; SameSite=Strict; Path=/; Max-Age={lifetime}"
        return Response(303, b"", "text/plain", headers=[("location", f"{req.path}#csrf={csrf}"),
                                                         ("set-cookie", cookie)])

    async def _peek(self, control: Control, rest: str) -> Response:
        """``/peek/3.1/stderr``: a run's file as text, for the links of a master's page."""
        fqid, _, name = rest.partition("/")
        try:
            request = wire.convert("peek", {"fqid": fqid, "name": name or "stdout"})
        except wire.BadRequest as exc:
            return _error(400, "bad request", str(exc), fqid=exc.fqid, field=exc.field)
        try:
            answer = await control.call(request)
        except UnknownJobError as exc:
            return _error(404, "unknown job", str(exc), fqid=fqid)
        except NotOwnerError as exc:
            return _not_owner(exc)
        except JobError as exc:
            return _error(409, "refused", str(exc), fqid=fqid, field=exc.field)
        return Response(200, str(answer["text"]).encode(), "text/plain; charset=utf-8")

    # ------------------------------------------------------------ methods
    async def _call(self, req: Request, control: Control, method: str) -> Response:
        if method == "openapi.json" and req.method in ("GET", "HEAD"):
            return Response(200, openapi_document())
        if method not in METHODS:
            return _error(404, "not found", f"no method {method!r}")
        try:  # the one checked boundary: nothing runs on a request that does not fit its type
            if req.method == "GET" and method in READ_ONLY:
                request = wire.decode_query(method, req.query)
            elif req.method == "POST":
                request = wire.decode(method, req.body)
            else:
                return _error(405, "method not allowed", f"{req.method} /api/{method}")
        except wire.BadRequest as exc:
            return _error(400, "bad request", str(exc), fqid=exc.fqid, field=exc.field)
        kwargs = wire.arguments(request)
        try:
            result = await control.call(request)
        except wire.BadRequest as exc:
            return _error(400, "bad request", str(exc), fqid=exc.fqid or _fqid(kwargs), field=exc.field)
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

    async def _events(self, control: Control, req: Request) -> AsyncIterator[bytes]:
        """Every event and change of the caller's jobs (all, for an admin), in order, until the client or the
        service goes, or the caller loses access (checked every :data:`RECHECK` seconds)."""
        caller = control.transport.caller
        visible = visible_to(caller, control.transport.owners.owner)
        receive = self.bus.subscribe(numbered=True)
        with receive:
            yield b": events follow\n\n"
            beat = check = anyio.current_time()
            while True:
                item: Any = None
                with anyio.move_on_after(RECHECK):
                    try:
                        item = await receive.receive()
                    except anyio.EndOfStream:
                        return
                now = anyio.current_time()
                if item is None or now >= check + RECHECK:  # idle: every wake; busy: every RECHECK
                    check = now
                    if caller_of(req, self.access, quiet=True) != caller:
                        log.info("event stream closed: its caller lost access", user=caller.name)
                        yield b'event: revoked\ndata: {"error":"unauthorized","message":"access revoked"}\n\n'
                        return
                if item is None:
                    if now >= beat + HEARTBEAT:
                        beat = now
                        yield b": idle\n\n"
                    continue
                beat = now
                if isinstance(item, Lagging):  # dropped: the client is told, then the stream ends
                    data = json.dumps({"error": "lagging", "message": str(item)})
                    yield f"event: lagging\ndata: {data}\n\n".encode()
                    return
                seq, event = item
                if isinstance(event, Event) and visible(event):
                    data = json.dumps({"seq": seq, **codec.encode(event)}, separators=(",", ":"), default=str)
                    yield f"data: {data}\n\n".encode()


def caller_of(req: Request, access: Access, *, quiet: bool = False) -> Caller | Response:
    """Who sent this request (checked on every one, by the active service and a standby alike), or the
    answer that turns them away."""
    if req.via == "unix":
        caller = access.by_uid(req.peer_uid)
        if caller is None:
            if not quiet:
                log.warning("refused a client of the socket", uid=req.peer_uid, path=req.path)
            return _error(403, "forbidden", access.refusal(req.peer_uid))
        return caller
    shown = _bearer(req.headers.get("authorization", ""))
    sid = _cookie(req.headers.get("cookie", ""), access.cookie) if shown is None else None
    if sid is not None:
        page = req.method in ("GET", "HEAD") and _is_page(req.path)
        csrf = req.headers.get("x-csrf-token") or next(reversed(req.query.get("csrf", [])), None)
        caller = access.by_session(sid, csrf, page=page)
    else:
        caller = access.by_token(shown)
    if caller is None:
        response = _error(401, "unauthorized", "a bearer token is required (see the service's token file, "
                                               "or ask its owner for one: orchestrator token USER)")
        response.headers.append(("www-authenticate", 'Bearer realm="orchestrator"'))
        return response
    return caller


def cross_site(req: Request) -> Response | None:
    """The answer to a request that could have been forged by another site (another port of the same host
    included), or ``None``: a ``POST`` must be JSON, and from the service's own origin if it names one."""
    if req.method != "POST":
        return None
    kind = req.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        return _error(415, "unsupported media type", f"POST {req.path}: the body must be sent as "
                                                     f"Content-Type: application/json, not {kind or 'none'!r}")
    origin = req.headers.get("origin")
    host = req.headers.get("host", "")
    fetched = req.headers.get("sec-fetch-site", "same-origin")
    if (origin is not None and origin not in (f"http://{host}", f"https://{host}")) or fetched not in (
            "same-origin", "none"):
        log.warning("refused a cross-origin request", path=req.path, origin=origin, host=host)
        return _error(403, "cross-origin", f"POST {req.path} from another origin ({origin}) is refused")
    return None


def _is_page(path: str) -> bool:
    return path in ("/", "/index.html") or path.startswith("/job/")


@cache
def _page(name: str) -> tuple[bytes, str]:
    """A page's HTML and its content security policy: its own inline scripts (by their hashes) and nothing else."""
    here = resources.files(__package__)
    html = here.joinpath(name).read_bytes()
    for tag, shared in re.findall(rb'<(script|style) data-inline="([a-z]+\.(?:js|css))"></\1>', html):
        html = html.replace(b'<%s data-inline="%s"></%s>' % (tag, shared, tag),  # the pages' common code
                            b"<%s>%s</%s>" % (tag, here.joinpath(shared.decode()).read_bytes(), tag))
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(m).digest()).decode()}'"
                      for m in re.findall(rb"<script>(.*?)</script>", html, re.S))
    csp = (f"default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; connect-src 'self'; "
           "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    return html, csp


def _html(name: str) -> Response:
    html, csp = _page(name)
    return Response(200, html, "text/html; charset=utf-8", headers=[("content-security-policy", csp)])


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
