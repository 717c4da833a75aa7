"""The state machine against random sequences of requests and driver reports (hypothesis, stateful).

The test plays the runtime and a backend: it answers the machine's
instructions (``Prepare``, ``SendSubmit``, ``SendKill``, ``Lookup``) in any
order and any way a real one could (all accepted, some rejected, an emulated
series cut short, a kill that failed), lets runs move and end at random, and
loses runs. After every step it checks the invariants:

- every change of a run is one the transition table allows (or forced by a user);
- a master that no request or linked job stands in for shows the status
  docs/design.md's six rules derive from its subjobs' statuses, the rules
  written out here (:func:`design_master_status`) and applied to the subjobs'
  statuses as read, never to the core's counters or its own rule;
- a run the backend accepted is monitored until it is final: every run the
  machine holds as submitted, running or completing is one the backend has;
- a run's attempt counter equals the submissions sent for it that were not
  taken back (left ``new`` because never attempted or rejected under emulated bulk);
- every request is answered exactly once;
- the core's own invariants hold (:meth:`StateMachine.validate_state`: counters, derived statuses, links).
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from orchestrator.core.analyser import Limits
from orchestrator.core.errors import JobError
from orchestrator.core.events import (
    AddRequested,
    Event,
    ForceStatusRequested,
    KillOutcomes,
    KillRequested,
    LookupOutcomes,
    Prepared,
    PrepareFailed,
    Profile,
    ReleaseRequested,
    Request,
    ResubmitRequested,
    RunLost,
    RunReport,
    RunsSilent,
    StatusReport,
    SubmitOutcomes,
    SubmitRequested,
)
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import Instruction, Lookup, Prepare, Reply, SendKill, SendSubmit, Unprepare
from orchestrator.core.machine import StateMachine
from orchestrator.core.statuses import JobStatus, allowed

S = JobStatus
ON_BACKEND = frozenset({S.SUBMITTED, S.RUNNING, S.COMPLETING})
EXAMPLES = int(os.environ.get("ORCH_PROPERTY_EXAMPLES", "2000"))
#: One of a list that grows as the sequence runs (the jobs added, the instructions under way, the runs a backend
#: holds), by position modulo its length: a fixed strategy, drawn with the rule's arguments.
PICK = st.integers(0, 255)
#: A request's one or two targets: (a job by :data:`PICK`, whether a subjob of it, which one modulo its subjobs).
TARGETS = st.lists(st.tuples(PICK, st.booleans(), st.integers(0, 3)), min_size=1, max_size=2)

#: docs/design.md, "Master status, recomputed on every subjob change, first rule that matches".
DESIGN_RULES = [
    ({S.SUBMITTED, S.SUBMITTING}, S.SUBMITTED),  # 1. any subjob submitted or submitting
    ({S.RUNNING, S.COMPLETING}, S.RUNNING),  # 2. any running or completing
    ({S.HELD}, S.HELD),  # 3. any held
    ({S.FAILED, S.NEW}, S.FAILED),  # 4. any failed, or any left new by a partial submission
    ({S.COMPLETED}, S.COMPLETED),  # 5. any completed
]


def design_master_status(subjobs: list[JobStatus], order: str) -> JobStatus:
    """The master's status by the design's rules, first match wins; "running-first" swaps rules 1 and 2."""
    rules = DESIGN_RULES if order == "submitted-first" else [DESIGN_RULES[1], DESIGN_RULES[0], *DESIGN_RULES[2:]]
    present = set(subjobs)
    for statuses, shown in rules:
        if present & statuses:
            return shown
    return S.KILLED  # 6. otherwise (all killed)


class Machine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.order = "submitted-first"
        self.sm = StateMachine(self.order)
        self.clock = 0.0
        self.n = 0
        self.jobs: list[int] = []
        self.outstanding: list[Instruction] = []
        #: Runs the fake backend holds, by attempt (a driver holds them by key, which names the attempt).
        self.backend: set[tuple[tuple[int, ...], int]] = set()
        #: The attempt each instruction's runs were at when it was issued (what a kill is bound to).
        self.bound: dict[int, dict[tuple[int, ...], int]] = {}
        self.sent: dict[tuple[int, ...], int] = {}  # submissions sent and not taken back, per run
        self.asked: set[str] = set()  # requests not answered yet
        self.splits: dict[int, int] = {}

    # ------------------------------------------------------------ plumbing
    def post(self, event: Event) -> None:
        self.clock += 1.0
        step = self.sm.handle(event)
        for change in step.changes:
            if change.indexes is None and self.sm.is_master(change.job):
                continue
            if change.old == S.SUBMITTING and change.new == S.NEW:  # a submission taken back
                for fq in change.fqids():
                    if fq in self.sent:
                        self.sent[fq] -= 1
            if not change.forced:
                assert allowed(change.old, change.new), f"{change} is outside the table"
        for ins in step.instructions:
            if isinstance(ins, Reply):
                assert ins.stimulus_id in self.asked, f"a reply to {ins.stimulus_id}, which was not asked or twice"
                self.asked.discard(ins.stimulus_id)
            elif isinstance(ins, SendSubmit):
                for fq in ins.runs:
                    self.sent[fq] = self.sent.get(fq, 0) + 1
                self.outstanding.append(ins)
            elif isinstance(ins, Unprepare):
                for fq in list(self.sent):
                    if fq[0] == ins.job and len(fq) == 2:
                        del self.sent[fq]
                self.sent.pop((ins.job,), None)
            elif isinstance(ins, (Prepare, SendKill, Lookup)):
                self.outstanding.append(ins)
        # Each instruction is bound to the attempts its runs had when it was issued: a kill issued before a
        # retry's submission in the same step is for the attempt before (the runtime keeps that order).
        later: dict[tuple[int, ...], int] = {}
        for ins in reversed(step.instructions):
            if isinstance(ins, (SendSubmit, SendKill, Lookup)):
                self.bound[id(ins)] = {fq: self.sm.attempt(fq) - later.get(fq, 0) for fq in ins.runs
                                       if fq in self.sm}
            if isinstance(ins, SendSubmit):
                for fq in ins.runs:
                    later[fq] = later.get(fq, 0) + 1

    def sid(self, kind: str) -> str:
        self.n += 1
        return f"{kind}-{self.n}"

    def ask(self, kind: type[Request], targets: list[tuple[int, ...]], **kw: Any) -> None:
        sid = self.sid(kind.__name__)
        self.asked.add(sid)
        self.post(kind(stimulus_id=sid, time=self.clock, targets=tuple(targets), **kw))

    def targets(self, picks: list[tuple[int, bool, int]]) -> list[tuple[int, ...]]:
        """The jobs or subjobs ``picks`` name: (a job, by position among those added; one of its subjobs or itself;
        which subjob). Drawn with the rule's other arguments from one fixed strategy (:data:`TARGETS`), not
        strategy by strategy while the rule runs: the same sequences, at a fraction of hypothesis's cost."""
        out: list[tuple[int, ...]] = []
        for k, sub, i in picks:
            job = self.jobs[k % len(self.jobs)]
            n = self.sm.n_subjobs(job)
            out.append((job, i % n) if n and sub else (job,))
        return out

    # ------------------------------------------------------------ users
    @initialize(order=st.sampled_from(["submitted-first", "running-first"]), native=st.booleans())
    def start(self, order: str, native: bool) -> None:
        self.order = order
        self.sm = StateMachine(order)
        self.add_job(native, True, 2, 0)

    @rule(native=st.booleans(), splits=st.booleans(), n=st.integers(1, 4), retries=st.integers(0, 2))
    def add_job(self, native: bool, splits: bool, n: int, retries: int) -> None:
        job = len(self.jobs)
        profile = Profile("sim", native_submit=native, native_kill=native, splits=splits,
                          limits=Limits(retries, retries, retries, 60.0))
        self.splits[job] = n if splits else 0
        self.ask(AddRequested, [(job,)], profile=profile)
        self.jobs.append(job)

    @rule(picks=TARGETS, keep_going=st.booleans())
    def submit(self, picks: list[tuple[int, bool, int]], keep_going: bool) -> None:
        self.ask(SubmitRequested, self.targets(picks), keep_going=keep_going)

    @rule(picks=TARGETS, keep_going=st.booleans())
    def kill(self, picks: list[tuple[int, bool, int]], keep_going: bool) -> None:
        self.ask(KillRequested, self.targets(picks), keep_going=keep_going)

    @rule(picks=TARGETS, keep_going=st.booleans(), only_failed=st.booleans())
    def resubmit(self, picks: list[tuple[int, bool, int]], keep_going: bool, only_failed: bool) -> None:
        self.ask(ResubmitRequested, self.targets(picks), keep_going=keep_going, only_failed=only_failed)

    @rule(picks=TARGETS)
    def release(self, picks: list[tuple[int, bool, int]]) -> None:
        self.ask(ReleaseRequested, self.targets(picks))

    @rule(picks=TARGETS, to=st.sampled_from([S.FAILED, S.COMPLETED]), force=st.booleans())
    def force_status(self, picks: list[tuple[int, bool, int]], to: JobStatus, force: bool) -> None:
        self.ask(ForceStatusRequested, self.targets(picks), status=to, force=force)

    # ------------------------------------------------------------ the runtime and the backend
    @precondition(lambda self: self.outstanding)
    @rule(data=st.data(), pick=PICK, roll=st.integers(0, 9))
    def answer(self, data: st.DataObject, pick: int, roll: int) -> None:
        """Answer one instruction under way: ``roll`` 0 fails a preparation or a whole native call; each run of a
        batch is then accepted or refused, killed or not, by rolls drawn for the batch at once."""
        ins = self.outstanding.pop(pick % len(self.outstanding))
        sid, t = ins.stimulus_id, self.clock
        if isinstance(ins, Prepare):
            if roll == 0:
                self.post(PrepareFailed(stimulus_id=sid, time=t, job=ins.job, error=JobError("bad split")))
            else:
                self.post(Prepared(stimulus_id=sid, time=t, job=ins.job, n_subjobs=self.splits[ins.job]))
        elif isinstance(ins, SendSubmit):
            self.answer_submit(ins, data, roll)
        elif isinstance(ins, SendKill):
            runs = list(ins.runs)
            rolls = data.draw(st.lists(st.integers(0, 4), min_size=len(runs), max_size=len(runs)))
            ok = [k for k in range(len(runs)) if rolls[k] > 0]
            bound = self.bound.pop(id(ins), {})
            for k in ok:
                self.backend.discard((runs[k], bound.get(runs[k], -1)))
            failed = [(k, "kill failed") for k in range(len(runs)) if k not in ok]
            self.post(KillOutcomes(stimulus_id=sid, time=t, runs=ins.runs, killed=ok, failed=failed))
        elif isinstance(ins, Lookup):
            self.post(LookupOutcomes(stimulus_id=sid, time=t, runs=ins.runs, absent=list(range(len(ins.runs)))))

    def answer_submit(self, ins: SendSubmit, data: st.DataObject, roll: int) -> None:
        runs = list(ins.runs)
        whole_call_failed = ins.native and roll == 0
        rolls = [1] * len(runs) if whole_call_failed else data.draw(
            st.lists(st.integers(0, 3), min_size=len(runs), max_size=len(runs)))
        accepted: list[int] = []
        rejected: list[tuple[int, str]] = []
        not_attempted: list[int] = []
        for k in range(len(runs)):
            if whole_call_failed:
                rejected.append((k, "unreachable"))
            elif not ins.native and ins.stop_on_failure and rejected:
                not_attempted.append(k)
            elif rolls[k] == 0:
                rejected.append((k, "refused"))
            else:
                accepted.append(k)
        bound = self.bound.pop(id(ins), {})
        for k in accepted:
            self.backend.add((runs[k], bound.get(runs[k], -1)))
        self.post(SubmitOutcomes(stimulus_id=ins.stimulus_id, time=self.clock, runs=ins.runs, accepted=accepted,
                                 rejected=rejected, not_attempted=not_attempted,
                                 native=ins.native and not whole_call_failed))

    @precondition(lambda self: self.backend)
    @rule(pick=PICK, to=st.sampled_from([S.RUNNING, S.COMPLETED, S.FAILED, S.HELD, S.KILLED]))
    def backend_moves(self, pick: int, to: JobStatus) -> None:
        held = sorted(self.backend)[pick % len(self.backend)]
        fq = held[0]
        if fq not in self.sm or self.sm.attempt(fq) != held[1]:
            self.backend.discard(held)  # an old attempt ends: its report names a key nobody waits for
            return
        if to != S.RUNNING:
            self.backend.discard(held)
        runs = Runs(fq[0], [fq[1]] if len(fq) == 2 else None)
        self.post(StatusReport(stimulus_id=self.sid("poll"), time=self.clock, backend="sim",
                               reports=(RunReport(runs, to, exit_code=0 if to == S.COMPLETED else 1),)))

    @precondition(lambda self: self.backend)
    @rule(pick=PICK, silence=st.sampled_from([None, 0.0, 599.0, 600.0, 3600.0]))
    def lose(self, pick: int, silence: float | None) -> None:
        held = sorted(self.backend)[pick % len(self.backend)]
        fq = held[0]
        if fq not in self.sm:
            return
        runs = Runs(fq[0], [fq[1]] if len(fq) == 2 else None)
        if silence is not None:  # silence reported: the core counts it lost once it lasted lost_after (600 s),
            # and not about an attempt that is no longer the run's
            self.post(RunsSilent(stimulus_id=self.sid("silent"), time=self.clock, backend="sim", runs=runs,
                                 attempts=(held[1],), since=self.clock - silence, reason="no answer"))
        elif self.sm.attempt(fq) == held[1]:
            self.post(RunLost(stimulus_id=self.sid("lost"), time=self.clock, runs=runs, reason="no answer"))

    # ------------------------------------------------------------ invariants
    @invariant()
    def core_state_is_valid(self) -> None:
        self.sm.validate_state()

    @invariant()
    def masters_follow_the_rules(self) -> None:
        for job in self.jobs:
            if not self.sm.is_master(job) or self.sm.busy(job):
                continue
            state = self.sm.job_state(job)
            if state.pinned is not None:
                continue
            expected = design_master_status([S.from_code(c) for c in self.sm.statuses(job)], self.order)
            if expected == S.COMPLETED and (state.post_failed or state.partition.get("failed")):
                expected = S.FAILED
            assert self.sm.status((job,)) == expected

    @invariant()
    def accepted_runs_are_monitored_until_final(self) -> None:
        for job in self.jobs:
            if (job,) not in self.sm:
                continue
            fqs = [(job, i) for i in range(self.sm.n_subjobs(job))] if self.sm.is_master(job) else [(job,)]
            for fq in fqs:
                if self.sm.status(fq) in ON_BACKEND:
                    held = (fq, self.sm.attempt(fq))
                    assert held in self.backend, f"{fq} is {self.sm.status(fq)} but no backend has it"

    @invariant()
    def attempts_count_the_submissions_sent(self) -> None:
        for fq, n in self.sent.items():
            if fq in self.sm and (len(fq) == 2 or not self.sm.is_master(fq[0])):
                assert self.sm.attempt(fq) == n, f"{fq}: attempt {self.sm.attempt(fq)}, sent {n}"

    def teardown(self) -> None:
        # Answer everything still under way: every request must then have been answered once.
        for _ in range(200):
            if not self.outstanding:
                break
            ins = self.outstanding.pop(0)
            if isinstance(ins, Prepare):
                self.post(Prepared(stimulus_id=ins.stimulus_id, time=self.clock, job=ins.job,
                                   n_subjobs=self.splits[ins.job]))
            elif isinstance(ins, SendSubmit):
                for fq, attempt in self.bound.pop(id(ins), {}).items():
                    self.backend.add((fq, attempt))
                self.post(SubmitOutcomes(stimulus_id=ins.stimulus_id, time=self.clock, runs=ins.runs,
                                         accepted=list(range(len(ins.runs))), native=ins.native))
            elif isinstance(ins, SendKill):
                self.post(KillOutcomes(stimulus_id=ins.stimulus_id, time=self.clock, runs=ins.runs,
                                       killed=list(range(len(ins.runs)))))
            elif isinstance(ins, Lookup):
                self.post(LookupOutcomes(stimulus_id=ins.stimulus_id, time=self.clock, runs=ins.runs,
                                         absent=list(range(len(ins.runs)))))
        assert not self.asked, f"requests never answered: {sorted(self.asked)}"


Machine.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=30, deadline=None,
                                     suppress_health_check=list(HealthCheck))
TestStateMachineProperties = Machine.TestCase
