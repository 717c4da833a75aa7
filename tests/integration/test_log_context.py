"""Every log line of a request's consequences carries the request's stimulus id (structlog's context).

docs/architecture.md, rule 3: the bus binds the id of the event it handles, the driver's actor binds the
id of the instruction it carries out (the driver's own lines included), and monitoring binds the id of
the report it makes. Seen here through structlog configured as the orchestrator configures it
(``merge_contextvars`` first), with a processor that keeps every line, and the ``chatty`` test backend,
which logs what it is asked to do.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog
from structlog.testing import LogCapture
from transports import collect_events

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator
from orchestrator.core.events import KillRequested, StatusChanged, StatusReport, SubmitRequested

pytestmark = pytest.mark.anyio


@pytest.fixture
def lines() -> Iterator[list[MutableMapping[str, Any]]]:
    capture = LogCapture()
    structlog.configure(processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                                    capture],
                        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
                        cache_logger_on_first_use=False)
    yield capture.entries
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


def of(lines: list[MutableMapping[str, Any]], event: str) -> list[MutableMapping[str, Any]]:
    return [line for line in lines if line["event"] == event]


async def test_a_requests_lines_and_its_drivers_carry_its_stimulus_id(tmp_path: Path, test_drivers: None,
                                                                      lines: list[MutableMapping[str, Any]]) -> None:
    seen: list[Any] = []

    def master_killed(events: list[Any]) -> bool:
        return any(isinstance(e, StatusChanged) and (0,) in e.ids and e.new.value == "killed" for e in events)

    job = Job(application=Executable("/bin/true"), splitter=ArgSplitter([["a"], ["b"], ["c"]]),
              backend=Backend("chatty", bulk=False, polled=True, run_seconds=60))
    async with Orchestrator(home=tmp_path, config={"core": {"poll_interval": 0.05}}) as orch:
        j = await orch.jobs.add(job)
        opened = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(collect_events, orch, seen, master_killed, opened)
            await opened.wait()
            await j.submit(keep_going=True)
            with anyio.fail_after(20):
                while j.status != "running":
                    await anyio.sleep(0.05)
            await j.kill()
            with anyio.fail_after(20):
                await j.wait()
    submit = next(e.stimulus_id for e in seen if isinstance(e, SubmitRequested))
    kill = next(e.stimulus_id for e in seen if isinstance(e, KillRequested))

    # The driver's own lines: each submission (emulated bulk: one call per run) under the submit's id, each
    # kill under the kill's, each status query under the id of the report it makes.
    assert sorted(r for line in of(lines, "driver submits") for r in line["runs"]) == ["0.0", "0.1", "0.2"]
    assert {line["stimulus_id"] for line in of(lines, "driver submits")} == {submit}
    assert sorted(r for line in of(lines, "driver kills") for r in line["runs"]) == ["0.0", "0.1", "0.2"]
    assert {line["stimulus_id"] for line in of(lines, "driver kills")} == {kill}
    asked = of(lines, "driver is asked")
    assert asked and all(line["stimulus_id"].startswith("poll-chatty-") for line in asked)
    reports = {e.stimulus_id for e in seen if isinstance(e, StatusReport)}
    assert reports and reports <= {line["stimulus_id"] for line in asked}  # the report names the query it came of

    # Every line logged while the home was open names the event or the instruction it belongs to.
    assert lines and all("stimulus_id" in line for line in lines), [ln for ln in lines if "stimulus_id" not in ln]
