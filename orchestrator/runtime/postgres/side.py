"""A small thread with its own asyncio loop, for what must not wait on the main loop.

Two things of a PostgreSQL repository live here, each on a connection of
its own. The synchronous look-ups of the public API (``j.subjobs[5]``
reads its delta): asyncpg is async only, and a synchronous caller on the
main loop cannot await, so the query runs on this loop and the caller
blocks on its result, as it would on a sqlite3 read (a round trip on a
local socket: a few hundred microseconds). And the lease's renewals: a main
loop busy for seconds (restoring 100,000 subjobs, a large split) must not
let the lease lapse, so they run here, where only the GIL can delay them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class SideLoop:
    """An asyncio loop in a daemon thread: ``call`` from synchronous code, ``run`` from the main loop."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def spawn(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the side loop; its future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the side loop and block until it is done (from any thread but the side one)."""
        return self.spawn(coro).result(timeout)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro``, run on the side loop, from another loop (cancelling this cancels it)."""
        return await asyncio.wrap_future(self.spawn(coro))

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop (tasks still on it are dropped) and wait for the thread."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
