"""structlog set-up: JSON for the service, readable lines on a terminal.

Every line about a job is logged through a logger bound to its ``fqid``
(``log.bind(fqid="3.1")``), so a job's story can be grepped out of any log.

No secret is ever logged: tracebacks never show local variables (rich's
default does), and :func:`redact` blanks, in every line, the values of keys
that name a secret (``authorization``, ``cookie``, ``token``, ``password``...)
and what looks like one inside any text (``Bearer ...``, ``token=...``,
``orch_session_8080=...``), tracebacks included.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog
from structlog.tracebacks import ExceptionDictTransformer

REDACTED = "[redacted]"
#: Keys whose values are secrets, wherever they appear in a line (headers, arguments, nested dicts).
SECRET_KEY = re.compile(r"(?i)^(?:.*[_-])?(?:authorization|cookie|set-cookie|token|password|passwd|secret|csrf|"
                        r"session|api[_-]?key|credentials?)$")
#: Secrets inside text: an authorization scheme's credentials, a ``key=value`` or ``key: value`` whose key names a
#: secret (a command's ``$(cat FILE)`` is not one), a session cookie.
SECRET_TEXT = re.compile(r"(?i)(\b(?:bearer|basic|token)\s+)[A-Za-z0-9._~+/=-]{8,}"
                         r"|(\b[\w-]*(?:token|password|passwd|secret|csrf|session|api[_-]?key|cookie)[\w-]*"
                         r"[\"']?\s*[=:]\s*[\"']?)(?!\$\()[^\s&;,'\"<>)\]}]{4,}")


def _scrub(text: str) -> str:
    return SECRET_TEXT.sub(lambda m: (m.group(1) or m.group(2)) + REDACTED, text)


def _redacted(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return _scrub(value)
    if depth > 8:
        return value
    if isinstance(value, Mapping):
        return {k: (REDACTED if isinstance(k, str) and SECRET_KEY.match(k) and v else _redacted(v, depth + 1))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if len(value) == 2 and isinstance(value[0], (str, bytes)) and SECRET_KEY.match(
                value[0].decode("latin-1") if isinstance(value[0], bytes) else value[0]):
            return [value[0], REDACTED]  # a header as a pair
        return [_redacted(v, depth + 1) for v in value]
    if isinstance(value, bytes):
        return _scrub(value.decode("latin-1"))
    return value


def redact(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
    """A structlog processor: secrets out of the line (see the module docstring)."""
    out: Mapping[str, Any] = _redacted(event)
    return out


def configure(*, json: bool | None = None, level: str = "WARNING", stream: Any = None) -> None:
    """Configure structlog once per process; ``json=None`` picks by terminal. Lines go to ``stream``
    (default stderr; the service logs to stdout, for supervisord to keep)."""
    out = sys.stderr if stream is None else stream
    if json is None:
        json = not out.isatty()
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(
        colors=False, exception_formatter=structlog.dev.plain_traceback)
    # Tracebacks as data, without local variables (which hold requests, headers and tokens); on a terminal as
    # plain text. Either way before redact(), which then sees them.
    tracebacks: Any = (structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False))
                       if json else structlog.processors.ExceptionRenderer())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            tracebacks,
            redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


def get_logger(**bound: Any) -> Any:
    """A logger that takes the configuration in force when it logs: one made at import time (most are) follows
    :func:`configure` called later (``.bind()`` at once would freeze structlog's defaults: a console renderer
    with rich tracebacks that show local variables)."""
    return structlog.get_logger("orchestrator", **bound)
