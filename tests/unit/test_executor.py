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


def executor() -> Executor:
    return Executor(actor=_nothing, flush=_nothing, work={}, forget=_nothing,  # type: ignore[arg-type]
                    set_backend=lambda ins: None, given_state=lambda sid: None, post=_nothing,
                    log=structlog.get_logger())


async def test_an_unknown_instruction_raises_naming_it() -> None:
    with pytest.raises(TypeError, match="no one carries out Unheard"):
        await executor().carry_out(Step("s-1", instructions=[Unheard(stimulus_id="s-1")]))


async def test_known_instructions_are_carried_out() -> None:
    ex = executor()
    waiting = ex.expect("s-2")
    await ex.carry_out(Step("s-2", instructions=[Reply(stimulus_id="s-2", acted=1)]))
    assert waiting.done.is_set() and waiting.reply is not None and waiting.reply.acted == 1
