"""A driver for the state machine in unit tests: events in, steps out, no loop, disk or backend.

It plays the runtime's part by hand: each call posts one event with a fresh
stimulus id and a clock that moves forward, and keeps every step, so a test
reads as the sequence of events it describes.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from orchestrator.core.analyser import Limits
from orchestrator.core.events import (
    AddRequested,
    Event,
    KillOutcomes,
    Prepared,
    Profile,
    Request,
    RunReport,
    StatusReport,
    SubmitOutcomes,
)
from orchestrator.core.ids import FQID, Runs
from orchestrator.core.instructions import Instruction, Reply, SendKill, SendSubmit
from orchestrator.core.machine import StateMachine
from orchestrator.core.runlog import RunLog
from orchestrator.core.statuses import JobStatus
from orchestrator.core.step import Change, Refusal, Step

S = JobStatus


def profile(backend: str = "sim", **kw: Any) -> Profile:
    kw.setdefault("splits", True)
    return Profile(backend, **kw)


def limits(early: int = 0, handled: int = 0, unhandled: int = 0, early_seconds: float = 60.0) -> Limits:
    return Limits(early, handled, unhandled, early_seconds)


class Harness:
    def __init__(self, order: str = "submitted-first", *, validate: bool = True, lost_after: float = 600.0) -> None:
        self.sm = StateMachine(order, lost_after=lost_after)
        #: Check the core's own invariants after every event (off where a test counts the core's own scans).
        self.validate = validate
        self.clock = 1000.0
        self.steps: list[Step] = []
        self._ids = itertools.count()
        self._next_job = 0
        self._sids: set[str] = set()

    # ------------------------------------------------------------ plumbing
    def sid(self, kind: str = "e") -> str:
        return f"{kind}-{next(self._ids)}"

    def post(self, event: Event) -> Step:
        self._sids.add(event.stimulus_id)
        step = self.sm.handle(event)
        if self.validate:  # every rule test also checks the core's own invariants after each event
            self.sm.validate_state()
        self.steps.append(step)
        # Everything a step holds answers an event posted so far: this one, or a request it set going again.
        parts: list[Change | Refusal | Instruction] = [*step.changes, *step.refusals, *step.instructions]
        for part in parts:
            assert part.stimulus_id in self._sids, f"{part} names no stimulus posted"
        return step

    def tick(self, seconds: float = 1.0) -> float:
        self.clock += seconds
        return self.clock

    # ------------------------------------------------------------ requests
    def add(self, prof: Profile | None = None, **kw: Any) -> int:
        job = self._next_job
        self._next_job += 1
        self.post(AddRequested(stimulus_id=self.sid("add"), time=self.clock, targets=((job,),),
                               profile=prof or profile(**kw)))
        return job

    def request(self, kind: type[Request], *targets: FQID | int, **kw: Any) -> Step:
        fqs = tuple(t if isinstance(t, tuple) else (t,) for t in targets)
        return self.post(kind(stimulus_id=self.sid(kind.__name__[:4].lower()), time=self.clock, targets=fqs, **kw))

    # ------------------------------------------------------------ the runtime's part
    def prepared(self, step: Step, job: int, n: int) -> Step:
        return self.post(Prepared(stimulus_id=step.stimulus_id, time=self.clock, job=job, n_subjobs=n))

    def outcomes(self, send: SendSubmit, accepted: Sequence[int] | None = None,
                 rejected: Sequence[tuple[int, str]] = (), not_attempted: Sequence[int] = (),
                 native: bool | None = None) -> Step:
        """Answer a SendSubmit; ``accepted`` are positions in its batch (default: all not otherwise named)."""
        named = {k for k, _ in rejected} | set(not_attempted)
        if accepted is None:
            accepted = [k for k in range(len(send.runs)) if k not in named]
        return self.post(SubmitOutcomes(stimulus_id=send.stimulus_id, time=self.clock, runs=send.runs,
                                        accepted=list(accepted), rejected=list(rejected),
                                        not_attempted=list(not_attempted),
                                        native=send.native if native is None else native))

    def killed(self, send: SendKill, killed: Sequence[int] | None = None,
               failed: Sequence[tuple[int, str]] = ()) -> Step:
        if killed is None:
            killed = [k for k in range(len(send.runs)) if k not in {k for k, _ in failed}]
        return self.post(KillOutcomes(stimulus_id=send.stimulus_id, time=self.clock, runs=send.runs,
                                      killed=list(killed), failed=list(failed)))

    def report(self, job: int, indexes: Sequence[int] | None, status: JobStatus, **kw: Any) -> Step:
        runs = Runs(job, indexes)
        return self.post(StatusReport(stimulus_id=self.sid("poll"), time=self.clock, backend="sim",
                                      reports=(RunReport(runs, status, **kw),)))

    def submit_all(self, job: int, n: int, keep_going: bool = True) -> Step:
        """Submit a master of ``n`` subjobs that the backend takes whole."""
        from orchestrator.core.events import SubmitRequested

        step = self.request(SubmitRequested, job, keep_going=keep_going)
        step = self.prepared(step, job, n)
        return self.outcomes(only(step, SendSubmit))

    # ------------------------------------------------------------ reading
    def status(self, *fq: int) -> JobStatus:
        return self.sm.status(tuple(fq))


def only(step: Step, kind: type[Instruction]) -> Any:
    found = step.of(kind)
    assert len(found) == 1, f"expected one {kind.__name__} in {step.instructions}"
    return found[0]


def reply(step: Step) -> Reply:
    return only(step, Reply)  # type: ignore[no-any-return]


def log(*lines: str) -> RunLog:
    from orchestrator.core.runlog import parse_log

    return parse_log("\n".join(lines))
