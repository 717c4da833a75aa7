"""structlog set-up: JSON for the service, readable lines on a terminal.

Every line about a job is logged through a logger bound to its ``fqid``
(``log.bind(fqid="3.1")``), so a job's story can be grepped out of any log.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure(*, json: bool | None = None, level: str = "WARNING", stream: Any = None) -> None:
    """Configure structlog once per process; ``json=None`` picks by terminal. Lines go to ``stream``
    (default stderr; the service logs to stdout, for supervisord to keep)."""
    out = sys.stderr if stream is None else stream
    if json is None:
        json = not out.isatty()
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )


def get_logger(**bound: Any) -> Any:
    return structlog.get_logger("orchestrator").bind(**bound)
