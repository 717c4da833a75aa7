"""Nothing piles up without bound: a slow backend holds new requests back, a slow observer is dropped.

docs/architecture.md, "Backpressure": a backend's actor with ``core.actor_mailbox`` instructions waiting
is lagging, and new requests and monitoring reports wait until it has taken them; an observer of
``orch.events()`` that falls ``core.events_buffer`` items behind is dropped, and told so (``Lagging``)
once it has read what it was sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from served import Service, start

from orchestrator import ArgSplitter, Backend, Executable, Job, Lagging, Orchestrator
from orchestrator.core.events import SubmitOutcomes, SubmitRequested

pytestmark = pytest.mark.anyio


async def backend_metrics(orch: Orchestrator, name: str) -> dict[str, Any]:
    return (await orch.metrics())["backends"].get(name, {"queued": 0, "driver": {}})  # type: ignore[no-any-return]


async def test_a_lagging_actor_holds_new_requests_back(tmp_path: Path, test_drivers: None) -> None:
    home = tmp_path / "home"
    stall = home / "backends" / "stalling" / "stall"
    stall.parent.mkdir(parents=True)
    stall.touch()  # the backend takes its time until the file goes
    seen: list[Any] = []
    config = {"core": {"actor_mailbox": 1}}
    async with Orchestrator(home=home, config=config) as orch:
        jobs = [await orch.jobs.add(Job(name=name, application=Executable("/bin/true"),
                                        backend=Backend("stalling", run_seconds=0.05))) for name in "abc"]
        a, b, c = jobs

        async def watch() -> None:
            async for ev in orch.events():
                seen.append(ev)

        async def until(what: str, check: Any) -> None:
            try:
                with anyio.fail_after(20):
                    while not await check():
                        await anyio.sleep(0.02)
            except TimeoutError:
                raise AssertionError(f"never came: {what}") from None

        async def in_call() -> bool:
            return bool((await backend_metrics(orch, "stalling"))["driver"].get("under_way") == 1)

        async def one_waiting() -> bool:
            return bool((await backend_metrics(orch, "stalling"))["queued"] == 1)

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            await anyio.sleep(0)
            tg.start_soon(a.submit)
            await until("a's submission is in the backend's hands", in_call)
            tg.start_soon(b.submit)
            await until("b's waits in the actor's mailbox: it is full", one_waiting)
            tg.start_soon(c.submit)
            await anyio.sleep(0.5)
            requested = [ev.targets for ev in seen if isinstance(ev, SubmitRequested)]
            assert requested == [((a.id,),), ((b.id,),)], "c's request went in while the actor lagged"
            assert c.status == "new"
            stall.unlink()
            for j in jobs:
                await j.wait(timeout=20)
            tg.cancel_scope.cancel()
    assert [j.status.value for j in jobs] == ["completed"] * 3
    c_asked = next(k for k, ev in enumerate(seen) if isinstance(ev, SubmitRequested) and ev.targets == ((c.id,),))
    a_answered = next(k for k, ev in enumerate(seen) if isinstance(ev, SubmitOutcomes) and ev.runs.job == a.id)
    assert a_answered < c_asked  # it went in once the actor took b, which it did when a's call returned


@pytest.mark.parametrize("through", ["embedded", "service"])
async def test_an_observer_that_falls_behind_is_dropped_and_told(tmp_path: Path, services: list[Service],
                                                                 through: str) -> None:
    """It reads nothing while jobs run; then it reads what it was sent, and ``Lagging``. Through a service,
    the socket's buffers hold more than ``events_buffer``: enough jobs that they fill too."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text("[core]\nevents_buffer = 10\n")
    if through == "service":
        start(services, home)
    n = 3 if through == "embedded" else 30
    async with Orchestrator(home=home) as orch:
        assert orch.remote is (through == "service")
        stream = orch.events()
        read: list[Any] = []
        async with anyio.create_task_group() as tg:
            async def first() -> None:  # the first read subscribes
                read.append(await stream.__anext__())

            tg.start_soon(first)
            await anyio.sleep(0.3)
            jobs = [await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("sim", bulk=False),
                                            splitter=ArgSplitter([["x"]] * 5))) for _ in range(n)]
            for j in jobs:
                await j.submit(keep_going=True)
        for j in jobs:
            await j.wait(timeout=20)
        with pytest.raises(Lagging, match="fell more than 10 events behind"):
            async for ev in stream:
                read.append(ev)
        await stream.aclose()
        assert len(read) > 1  # what it was sent before it was dropped came first
        assert [j.status.value for j in jobs] == ["completed"] * n  # the bus went on without it
