"""A real headless Chromium for tests, driven over the Chrome DevTools Protocol (CDP).

:class:`Chromium` runs the browser (its own throw-away profile, the DevTools
port chosen by the browser and read from ``DevToolsActivePort``) and stops
it by pid. :class:`Cdp` is a minimal protocol client on one page target:
commands with ids over a websocket, events kept in a list, and
``Runtime.evaluate`` with ``returnByValue`` for reading the DOM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

#: Names the browser goes by, first found wins.
BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_binary() -> str | None:
    """The Chromium (or Chrome) executable on ``PATH``, else ``None``."""
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    return None


class Chromium:
    """One headless browser process; ``start()``, then ``stop()`` (SIGTERM, then SIGKILL)."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.binary = binary
        self.profile = profile
        self.log = profile.parent / f"{profile.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self, timeout: float = 30.0) -> Chromium:
        self.profile.mkdir(parents=True, exist_ok=True)
        args = [self.binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                f"--user-data-dir={self.profile}", "about:blank"]
        with open(self.log, "wb") as log:
            # Its own session: the browser's helper processes can be found (and ended) by its pid's group.
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                first = active.read_text().splitlines()[0].strip()
            except (FileNotFoundError, IndexError):
                first = ""
            if first.isdigit():
                self.port = int(first)
                return self
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"chromium wrote no {active} within {timeout} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def stop(self, grace: float = 5.0) -> None:
        proc = self.proc
        if proc is None:
            return
        self.proc = None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(grace)
        # Helpers (renderer, zygote, gpu) left behind: the group is the one started above, led by proc.pid.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    async def page(self, timeout: float = 10.0) -> Cdp:
        """A CDP session on the browser's first page target."""
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=5.0) as client:
            while True:
                targets = (await client.get(f"http://127.0.0.1:{self.port}/json")).json()
                pages = [t for t in targets if t.get("type") == "page" and t.get("webSocketDebuggerUrl")]
                if pages:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no page target in {targets}")
                await asyncio.sleep(0.1)
        return await Cdp.open(pages[0]["webSocketDebuggerUrl"])


class CdpError(RuntimeError):
    """A command the browser refused, or a script that threw."""


class Cdp:
    """A DevTools session on one target: ``await send(method, **params)`` returns the command's result."""

    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._next_id = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, url: str) -> Cdp:
        return cls(await connect(url, max_size=None, open_timeout=10))

    async def _read(self) -> None:
        try:
            async for raw in self._ws:
                message = json.loads(raw)
                future = self._waiting.pop(message["id"], None) if "id" in message else None
                if future is None:
                    self.events.append(message)
                elif future.done():
                    continue
                elif "error" in message:
                    future.set_exception(CdpError(f"{message['error']}"))
                else:
                    future.set_result(message.get("result", {}))
        except ConnectionClosed:
            pass
        finally:
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(CdpError("the DevTools connection closed"))
            self._waiting.clear()

    async def send(self, method: str, timeout: float = 10.0, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        ident = self._next_id
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        await self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._waiting.pop(ident, None)

    async def evaluate(self, expression: str, timeout: float = 10.0) -> Any:
        """The value of a JavaScript expression in the page (awaited if it is a promise)."""
        result = await self.send("Runtime.evaluate", timeout, expression=expression, returnByValue=True,
                                 awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CdpError(f"{expression[:80]!r} threw: {text}")
        return result.get("result", {}).get("value")

    async def navigate(self, url: str, timeout: float = 15.0) -> None:
        """Go to ``url`` and wait until the document (after any redirect) has loaded."""
        result = await self.send("Page.navigate", timeout, url=url)
        if result.get("errorText"):
            raise CdpError(f"navigate {url}: {result['errorText']}")
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(CdpError):  # "execution context was destroyed" while the page changes
                if await self.evaluate("document.readyState") == "complete":
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not load within {timeout} s")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
