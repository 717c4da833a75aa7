"""The control API as an OpenAPI 3.1 document (``GET /api/openapi.json``), generated from the request types.

Each control method is ``POST /api/<method>`` with its typed request
(:mod:`orchestrator.api.wire`) as the JSON body; the read-only ones are
also ``GET /api/<method>`` with the same fields as query parameters. Every
method answers 200 with its result, or one of the error answers
(:class:`ErrorAnswer`): 400 a request that does not fit its type, 401 no
token (TCP), 403 a caller the service does not admit or another user's job,
404 an unknown job, 409 a refused operation, 413 a body over the limit.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
from typing import Any

import msgspec

from ..api import wire
from .control import READ_ONLY

ERRORS = {
    "400": "bad request: a field that does not fit the method's type (``field`` names its path); nothing is stored",
    "401": "unauthorized: TCP without a valid bearer token",
    "403": "forbidden (a caller the service does not admit), or not owner (another user's job)",
    "404": "unknown job, or no such method",
    "409": "refused: the operation is not possible now (``fqid`` and ``field`` name the job and the field)",
    "413": "the request body is over ``[service] max_request_bytes``",
}


class ErrorAnswer(msgspec.Struct):
    """What every refusal answers."""

    error: str
    message: str
    fqid: str | None = None
    field: str | None = None
    #: With ``"not owner"``: the job's owner and the caller.
    owner: str | None = None
    user: str | None = None


def _version() -> str:
    try:
        return importlib.metadata.version("orchestrator")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def _query_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A property's schema without its ``null`` branch (a query parameter is absent, never null)."""
    options = schema.get("anyOf")
    if options is None:
        return {k: v for k, v in schema.items() if k != "default"}
    kept = [o for o in options if o.get("type") != "null"]
    return kept[0] if len(kept) == 1 else {"anyOf": kept}


def build() -> dict[str, Any]:
    methods = sorted(wire.REQUESTS)
    refs, components = msgspec.json.schema_components(
        [wire.REQUESTS[m] for m in methods] + [ErrorAnswer], ref_template="#/components/schemas/{name}")
    ref_of = dict(zip([*methods, "error"], refs, strict=True))
    errors = {code: {"description": text, "content": {"application/json": {"schema": ref_of["error"]}}}
              for code, text in ERRORS.items()}
    ok = {"description": "the method's result", "content": {"application/json": {"schema": {}}}}
    paths: dict[str, Any] = {}
    for method in methods:
        cls = wire.REQUESTS[method]
        doc = (cls.__doc__ or "").strip() if cls.__doc__ != wire.Request.__doc__ else ""
        post = {"operationId": method, "summary": doc or f"the {method} control method",
                "requestBody": {"required": True, "content": {"application/json": {"schema": ref_of[method]}}},
                "responses": {"200": ok, **errors}}
        paths[f"/api/{method}"] = {"post": post}
        if method in READ_ONLY:
            schema = components[cls.__name__]
            lists = wire.list_fields(cls)
            parameters = []
            for name, prop in schema.get("properties", {}).items():
                parameter: dict[str, Any] = {"name": name, "in": "query", "schema": _query_schema(prop),
                                             "required": name in schema.get("required", ())}
                if name in lists:
                    parameter.update(style="form", explode=True)
                parameters.append(parameter)
            paths[f"/api/{method}"]["get"] = {"operationId": f"{method}_get", "parameters": parameters,
                                              "responses": {"200": ok, **errors}}
    paths["/health"] = {"get": {"operationId": "health_check", "responses": {"200": ok, "401": errors["401"],
                                                                               "403": errors["403"]}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "orchestrator service control API", "version": _version(),
                 "description": __doc__.strip() if __doc__ else ""},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}}},
        "security": [{}, {"token": []}],
    }


@functools.cache
def openapi_document() -> bytes:
    """The document, as JSON (made once)."""
    return json.dumps(build(), separators=(",", ":")).encode()
