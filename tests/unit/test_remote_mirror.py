"""The remote transport's mirror against a scripted service: a read answered after a change the stream brought.

Through a real service this is a race that loaded machines lose now and then (a job seen ``submitted`` for the
whole of its run); here the service is a stand-in client whose answers the test orders, as httpx's
``MockTransport`` stands in for a server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator.api import wire
from orchestrator.api.remote import Remote
from orchestrator.core import codec
from orchestrator.core.events import StatusChanged
from orchestrator.core.ids import Runs
from orchestrator.core.statuses import JobStatus

pytestmark = pytest.mark.anyio


class ScriptedService:
    """The calls the remote transport makes of a service client; the stream and the reads go as the test says."""

    def __init__(self) -> None:
        self.socket = Path("/nonexistent/service.sock")
        self.stream_in, self.stream_out = anyio.create_memory_object_stream[dict[str, Any]](100)
        self.snapshots: list[tuple[anyio.Event, dict[str, Any]]] = []
        self.asked = anyio.Event()

    @staticmethod
    def snapshot(step: int, status: str, codes: str | None = None) -> dict[str, Any]:
        job = {"id": 0, "name": "j", "spec": {}, "added": 0.0, "owner": "me", "status": status, "active": True,
               "codes": codes}
        return {"step": step, "jobs": [job], "workspace": "", "gone": [], "caller": {"name": "me", "admin": False}}

    async def __aenter__(self) -> ScriptedService:
        return self

    async def aclose(self) -> None:
        self.stream_in.close()

    def sync(self) -> Any:
        class Sync:
            def close(self) -> None:
                pass
        return Sync()

    async def events(self, opened: anyio.Event | None = None) -> AsyncIterator[dict[str, Any]]:
        if opened is not None:
            opened.set()
        async for item in self.stream_out:
            yield item

    async def send(self, request: Any) -> dict[str, Any]:
        assert isinstance(request, wire.DescribeRequest)
        release, answer = self.snapshots.pop(0)
        self.asked.set()
        await release.wait()
        return answer


async def test_a_read_answered_after_a_streamed_change_keeps_the_change(tmp_path: Path) -> None:
    service = ScriptedService()
    now = anyio.Event()
    now.set()
    service.snapshots.append((now, service.snapshot(5, "submitted")))  # the read at opening
    late = anyio.Event()
    service.snapshots.append((late, service.snapshot(6, "submitted")))  # a read taken at step 6, answered late
    remote = Remote(tmp_path, service)  # type: ignore[arg-type]
    async with AsyncExitStack() as stack:
        await remote.open(stack)
        assert remote.statuses().status((0,)) == JobStatus.SUBMITTED
        service.asked = anyio.Event()
        await service.stream_in.send({"seq": 6, "type": "AddRequested", "targets": [[0]]})  # job 0 is read again
        with anyio.fail_after(5):
            await service.asked.wait()
        running = StatusChanged(stimulus_id="r", time=0.0, changed=Runs(0), old=JobStatus.SUBMITTED,
                                new=JobStatus.RUNNING)
        await service.stream_in.send({"seq": 7, **codec.encode(running)})  # step 7, streamed before the read ends
        with anyio.fail_after(5):
            while remote.statuses().status((0,)) != JobStatus.RUNNING:
                await anyio.sleep(0.01)
        late.set()  # the read of step 6 arrives now
        with anyio.fail_after(5):
            while service.snapshots or not late.is_set():
                await anyio.sleep(0.01)
        await anyio.sleep(0.1)
        assert remote.statuses().status((0,)) == JobStatus.RUNNING, "a read older than the change it followed undid it"


async def test_a_split_read_after_its_subjobs_changed_shows_them_with_the_changes(tmp_path: Path) -> None:
    """A master split while a read was under way: the stream's changes of its subjobs came before the mirror
    knew them; the read that brings the split has them applied on top, and submit() sees the subjobs."""
    service = ScriptedService()
    now = anyio.Event()
    now.set()
    service.snapshots.append((now, service.snapshot(5, "new")))  # the read at opening: not split yet
    late = anyio.Event()
    submitted = str(JobStatus.SUBMITTED.code)
    service.snapshots.append((late, service.snapshot(6, "submitted", submitted * 2)))  # split at step 6
    remote = Remote(tmp_path, service)  # type: ignore[arg-type]
    async with AsyncExitStack() as stack:
        await remote.open(stack)
        assert remote.statuses().n_subjobs(0) == 0
        service.asked = anyio.Event()
        master = StatusChanged(stimulus_id="s", time=0.0, changed=Runs(0), old=JobStatus.NEW,
                               new=JobStatus.RUNNING)
        first = StatusChanged(stimulus_id="r", time=0.0, changed=Runs(0, [0]), old=JobStatus.SUBMITTED,
                              new=JobStatus.COMPLETED)
        await service.stream_in.send({"seq": 7, **codec.encode(master)})
        await service.stream_in.send({"seq": 8, **codec.encode(first)})  # subjob 0, unknown yet: read again
        with anyio.fail_after(5):
            await service.asked.wait()
        late.set()  # the read of step 6 arrives after both changes
        with anyio.fail_after(5):
            while remote.statuses().n_subjobs(0) != 2:
                await anyio.sleep(0.01)
        assert remote.statuses().status((0,)) == JobStatus.RUNNING
        assert [remote.statuses().status((0, i)) for i in (0, 1)] == [JobStatus.COMPLETED, JobStatus.SUBMITTED]

