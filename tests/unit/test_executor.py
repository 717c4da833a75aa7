"""The executor refuses an instruction no one carries out (runtime.executor): a core that emits a new kind of
instruction the runtime was not taught must fail loudly, not leave a request waiting for ever."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import structlog

from orchestrator.core.instructions import Instruction, Reply
from orchestrator.core.step import Step
from orchestrator.runtime.executor import Executor

pytestmark = pytest.mark.anyio


@dataclass(frozen=True, slots=True, kw_only=True)
class Unheard(Instruction):
    """An instruction the runtime has no case for."""


async def _nothing(*_: Any) -> None:
    return None


def executor(replies: list[Reply] | None = None) -> Executor:
    """An executor whose pieces are never reached (the instructions below need none of them)."""
    unused: Any = None
    return Executor(backends=unused, writer=unused, definitions=unused, workspace=unused, work={}, post=_nothing,
                    reply=(replies if replies is not None else []).append, log=structlog.get_logger())


async def test_an_unknown_instruction_raises_naming_it() -> None:
    with pytest.raises(TypeError, match="no one carries out Unheard"):
        await executor().carry_out(Step("s-1", instructions=[Unheard(stimulus_id="s-1")]))


async def test_known_instructions_are_carried_out() -> None:
    replies: list[Reply] = []
    reply = Reply(stimulus_id="s-2", acted=1)
    await executor(replies).carry_out(Step("s-2", instructions=[reply]))
    assert replies == [reply]  # handed to the inbox, which wakes the request's caller
