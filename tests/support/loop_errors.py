"""What the running asyncio loop reports to its exception handler, caught for a test to assert on.

A callback that fails (``Future.set_result`` on a cancelled future, say) never reaches the task that caused
it: the loop hands it to its exception handler, which by default only logs it. Inside this context the
reports are collected instead, and the previous handler is put back on leaving.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def caught_loop_errors() -> Iterator[list[dict[str, Any]]]:
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    caught: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: caught.append(context))
    try:
        yield caught
    finally:
        loop.set_exception_handler(previous)
