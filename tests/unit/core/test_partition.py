"""DataGrid's partitioned job through the state machine: pre-job -> subjobs -> aggregator (core.partition),
and the linked jobs' own submissions and lookups (core.outcomes)."""

from __future__ import annotations

from typing import Any

from orchestrator.core.errors import JobError
from orchestrator.core.events import (
    KillRequested,
    LinkedAdded,
    LookupOutcomes,
    Prepared,
    PrepareFailed,
    ResubmitRequested,
    SubmitRequested,
)
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import CreateLinked, Forget, Notify, Prepare, SendKill, SendSubmit, Unprepare
from orchestrator.core.statuses import JobStatus
from orchestrator.core.step import Step
from orchestrator.core.table import RunTable

from .harness import Harness, only, profile, reply

S = JobStatus
FINAL_STATE = {"final": True, "label": "L", "seq": 2}


class Grid:
    """A master with a pre-job and an aggregator, its linked jobs added as the runtime would."""

    def __init__(self, n: int = 3, prejob: bool = True, profile_native: bool = True, **kw: Any) -> None:
        self.h = Harness()
        self.n = n
        self.m = self.h.add(prejob=prejob, aggregator=True, native_submit=profile_native, **kw)
        self.submit_step = self.h.request(SubmitRequested, self.m)
        self.sid = self.submit_step.stimulus_id

    def split(self) -> Step:
        return self.h.prepared(self.submit_step, self.m, self.n)

    def link(self, job: int, role: str, sid: str | None = None) -> Step:
        return self.h.post(LinkedAdded(stimulus_id=sid or self.sid, time=self.h.clock, job=job, master=self.m,
                                       role=role, profile=profile(splits=False)))

    def prepare_linked(self, job: int, sid: str | None = None) -> Step:
        return self.h.post(Prepared(stimulus_id=sid or self.sid, time=self.h.clock, job=job))

    def aggregator_submitted(self) -> None:
        """The subjobs done, the aggregator (job 2) linked, prepared and accepted by its backend."""
        sid = self.subjobs_done().stimulus_id
        self.link(2, "aggregator", sid)
        self.h.outcomes(only(self.prepare_linked(2, sid), SendSubmit))

    def prejob_running(self) -> int:
        self.split()
        self.link(1, "prejob")
        self.h.outcomes(only(self.prepare_linked(1), SendSubmit))
        self.h.report(1, None, S.RUNNING)
        return 1

    def subjobs_done(self, states: dict[int, dict[str, Any]] | None = None, status: JobStatus = S.COMPLETED,
                     ) -> Step:
        """The pre-job completes, the subjobs run (saving ``states``) and end in ``status``."""
        self.prejob_running()
        step = self.h.report(1, None, S.COMPLETED)
        self.h.outcomes(only(step, SendSubmit))
        for i in range(self.n):
            state = FINAL_STATE if states is None else states.get(i)
            self.h.report(self.m, [i], S.RUNNING, state=state)
        return self.h.report(self.m, list(range(self.n)), status)

    def info(self, *fq: int) -> dict[str, Any]:
        return self.h.sm.info(fq)

    def master_dirty(self) -> bool:
        return self.m in self.h.sm.take_dirty()[1]

    def phase(self) -> Any:
        return self.info(self.m)["partition"].get("phase")

    def status(self, *fq: int) -> JobStatus:
        return self.h.status(*fq)


def moves(step: Step) -> list[tuple[int, Any, str, str]]:
    return [(c.job, c.indexes, c.old.value, c.new.value) for c in step.changes]


# ------------------------------------------------------------------ the pre-job
def test_the_prejob_runs_first_and_the_master_shows_its_status() -> None:
    g = Grid()
    step = g.split()
    assert step.instructions == [CreateLinked(stimulus_id=g.sid, master=g.m, role="prejob")]
    assert g.phase() == "starting" and g.status(g.m) == S.SUBMITTING
    assert g.h.sm.counts(g.m)[S.NEW] == 3
    step = g.link(1, "prejob")
    assert step.instructions == [Prepare(stimulus_id=g.sid, job=1)]
    assert g.info(g.m)["partition"] == {"phase": "starting", "prejob": 1}
    assert g.info(1)["partition"] == {"master": g.m, "role": "prejob"}
    step = g.prepare_linked(1)
    step = g.h.outcomes(only(step, SendSubmit))
    assert moves(step) == [(1, None, "submitting", "submitted"), (g.m, None, "submitting", "submitted")]
    assert reply(step).error is None
    assert g.phase() == "prejob"
    step = g.h.report(1, None, S.RUNNING)
    assert moves(step) == [(1, None, "submitted", "running"), (g.m, None, "submitted", "running")]
    step = g.h.report(1, None, S.COMPLETING)
    assert moves(step) == [(1, None, "running", "completing")]
    assert g.status(g.m) == S.RUNNING
    step = g.h.report(1, None, S.COMPLETED)
    assert moves(step) == [(1, None, "completing", "completed"), (g.m, [0, 1, 2], "new", "submitting"),
                           (g.m, None, "running", "submitted")]
    send = only(step, SendSubmit)
    assert send.runs == Runs(g.m, [0, 1, 2]) and send.start == "initial"
    assert g.phase() == "subjobs" and "reason" not in g.info(g.m) or g.info(g.m)["reason"] is None


def test_a_prejob_that_fails_starts_no_subjob() -> None:
    g = Grid()
    g.prejob_running()
    step = g.h.report(1, None, S.FAILED, exit_code=3, reason="disk full")
    assert not step.of(SendSubmit)
    assert g.phase() == "prejob-ended"
    assert g.info(g.m)["reason"] == "prejob 1 failed: disk full; no subjob was started"
    assert g.h.sm.counts(g.m)[S.NEW] == 3
    assert g.status(g.m) == S.FAILED
    refused = reply(g.h.request(ResubmitRequested, g.m)).error
    assert isinstance(refused, JobError)
    assert "its prejob 1 did not complete: resubmit the prejob (the subjobs start once it completes)" \
        in str(refused)
    # the user resubmits the pre-job: its phase again, and the master shows it
    step = g.h.request(ResubmitRequested, 1)
    assert g.phase() == "prejob"
    g.h.outcomes(only(step, SendSubmit))
    assert g.status(g.m) == S.SUBMITTED
    step = g.h.report(1, None, S.COMPLETED)
    assert g.phase() == "subjobs" and step.of(SendSubmit)


def test_a_prejob_killed_without_a_reason() -> None:
    g = Grid()
    g.prejob_running()
    g.h.report(1, None, S.KILLED)
    assert g.info(g.m)["reason"] == "prejob 1 killed: killed; no subjob was started"


def test_subjobs_cannot_be_resubmitted_while_the_prejob_runs() -> None:
    g = Grid()
    g.prejob_running()
    error = reply(g.h.request(ResubmitRequested, g.m)).error
    assert error is not None
    assert "its prejob 1 has not completed: the subjobs start once it completes" in str(error)


def test_a_prejob_that_cannot_be_submitted_undoes_the_split() -> None:
    g = Grid()
    g.split()
    g.link(1, "prejob")
    step = g.prepare_linked(1)
    step = g.h.outcomes(only(step, SendSubmit), accepted=[], rejected=[(0, "queue full")])
    assert Forget(stimulus_id=g.sid, job=1) in step.instructions
    assert Unprepare(stimulus_id=g.sid, job=g.m) in step.instructions
    error = reply(step).error
    assert str(error) == f"job {g.m}: the prejob could not be submitted: job 1: submission failed: queue full"
    assert g.status(g.m) == S.NEW and not g.h.sm.is_master(g.m)
    assert 1 not in g.h.sm.job_ids()
    assert "partition" not in g.info(g.m)


def test_a_prejob_whose_preparation_failed() -> None:
    g = Grid()
    g.split()
    g.link(1, "prejob")
    step = g.h.post(PrepareFailed(stimulus_id=g.sid, time=g.h.clock, job=1, error=JobError("no exe", fqid="1")))
    assert str(reply(step).error) == f"job {g.m}: the prejob could not be submitted: job 1: no exe"
    assert g.status(g.m) == S.NEW


def test_a_linked_job_of_an_unknown_master_is_ignored() -> None:
    g = Grid()
    step = g.h.post(LinkedAdded(stimulus_id="x", time=1.0, job=5, master=99, role="prejob", profile=profile()))
    assert not step
    assert 5 not in g.h.sm.job_ids()


# ------------------------------------------------------------------ the aggregator
def test_the_aggregator_runs_over_the_subjobs_final_states() -> None:
    g = Grid()
    step = g.subjobs_done(states={0: {"final": True, "label": "a"}, 1: {"final": True, "seq": 4},
                                  2: {"final": True}})
    created = only(step, CreateLinked)
    assert created == CreateLinked(stimulus_id=step.stimulus_id, master=g.m, role="aggregator",
                                   steps=("a", f"{g.m}.1:4", f"{g.m}.2:0"), reuse=None)
    assert g.phase() == "aggregator" and g.status(g.m) == S.SUBMITTED
    assert g.info(g.m)["partition"]["failed"] is False
    assert g.info(g.m)["partition"]["aggregated"] == g.h.clock
    sid = step.stimulus_id
    step = g.link(2, "aggregator", sid)
    assert step.instructions == [Prepare(stimulus_id=sid, job=2)]
    step = g.h.outcomes(only(g.prepare_linked(2, sid), SendSubmit))
    assert g.status(g.m) == S.SUBMITTED
    step = g.h.report(2, None, S.RUNNING)
    assert moves(step) == [(2, None, "submitted", "running"), (g.m, None, "submitted", "running")]
    step = g.h.report(2, None, S.COMPLETED)
    assert moves(step) == [(2, None, "running", "completed"), (g.m, None, "running", "completed")]
    assert g.phase() == "aggregator-ended"
    assert g.info(g.m)["partition"]["failed"] is False
    assert g.info(g.m).get("reason") is None


def test_a_failed_aggregator_fails_the_master() -> None:
    g = Grid()
    step = g.subjobs_done()
    sid = step.stimulus_id
    g.link(2, "aggregator", sid)
    g.h.outcomes(only(g.prepare_linked(2, sid), SendSubmit))
    step = g.h.report(2, None, S.FAILED, exit_code=1, reason="merge broke")
    assert moves(step)[-1] == (g.m, None, "submitted", "failed")
    assert g.info(g.m)["reason"] == "aggregator 2 failed: merge broke"
    assert g.info(g.m)["partition"]["failed"] is True and g.phase() == "aggregator-ended"


def test_an_aggregator_that_cannot_be_submitted_fails_the_master() -> None:
    g = Grid()
    sid = g.subjobs_done().stimulus_id
    g.link(2, "aggregator", sid)
    step = g.h.outcomes(only(g.prepare_linked(2, sid), SendSubmit), accepted=[], rejected=[(0, "no slot")])
    assert g.info(g.m)["reason"] == "the aggregator could not be submitted: job 2: submission failed: no slot"
    assert g.status(g.m) == S.FAILED and g.info(g.m)["partition"]["failed"] is True
    assert moves(step)[-1] == (g.m, None, "submitted", "failed")


def test_too_few_final_states_start_no_aggregator() -> None:
    g = Grid(min_success=0.6)
    step = g.subjobs_done(states={0: FINAL_STATE, 1: {"final": False, "label": "x"}})
    assert not step.of(CreateLinked)
    assert g.info(g.m)["reason"] == ("only 1 of 3 subjobs reached a final state (min_success=0.6); "
                                     "the aggregator was not started")
    assert g.status(g.m) == S.FAILED and g.phase() == "aggregator-ended"


def test_just_enough_final_states_start_the_aggregator() -> None:
    g = Grid(n=5, min_success=0.4)
    step = g.subjobs_done(states={0: FINAL_STATE, 3: FINAL_STATE})
    assert only(step, CreateLinked).steps == ("L", "L")


def test_an_aggregator_only_job_starts_its_subjobs_at_once() -> None:
    g = Grid(prejob=False)
    step = g.split()
    assert step.of(SendSubmit) and not step.of(CreateLinked)
    assert g.phase() == "subjobs"


def test_a_later_round_of_the_aggregator_reuses_it() -> None:
    g = Grid()
    g.aggregator_submitted()
    g.h.report(2, None, S.COMPLETED)
    # subjob 0 runs again and ends: a new round over the new states
    step = g.h.request(ResubmitRequested, (g.m, 0), only_failed=False)
    assert reply(g.h.outcomes(only(step, SendSubmit))).error is None
    g.h.report(g.m, [0], S.RUNNING, state=FINAL_STATE)
    step = g.h.report(g.m, [0], S.COMPLETED)
    created = only(step, CreateLinked)
    assert created.reuse == 2
    step = g.link(2, "aggregator", step.stimulus_id)
    assert moves(step)[0] == (2, None, "completed", "submitting")
    assert only(step, SendSubmit).runs == Runs(2)


def test_a_held_master_notifies_once() -> None:
    h = Harness()
    m = h.add(notify_held=True)
    h.submit_all(m, 2)
    step = h.report(m, [0], S.HELD, verdict="cancelled")
    assert not step.of(Notify) and h.status(m) == S.SUBMITTED
    step = h.report(m, [1], S.HELD, verdict="cancelled")
    assert step.of(Notify) == [Notify(stimulus_id=step.stimulus_id, job=m, status=S.HELD)]
    assert h.status(m) == S.HELD
    step = h.report(m, [1], S.HELD, verdict="cancelled")
    assert not step.of(Notify)


def test_a_held_master_without_notification() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 1)
    step = h.report(m, [0], S.HELD, verdict="cancelled")
    assert h.status(m) == S.HELD and not step.of(Notify)


# ------------------------------------------------------------------ lookups after a crash
def test_lookup_adopts_found_runs_and_resends_absent_ones() -> None:
    h = Harness()
    m = h.add()
    step = h.request(SubmitRequested, m)
    step = h.prepared(step, m, 4)
    send = only(step, SendSubmit)
    h.outcomes(send, accepted=[0])
    h.sm.load(m, profile(), created=1.0, table=h.sm.job_state(m).runs, master=True)
    step = h.post(LookupOutcomes(stimulus_id="look", time=h.clock, runs=Runs(m, [0, 1, 2, 3]), found=[0, 1],
                                 absent=[2]))
    assert moves(step)[0] == (m, [1], "submitting", "submitted")
    resend = only(step, SendSubmit)
    assert resend.runs == Runs(m, [2])
    assert h.sm.indexes(m, [S.SUBMITTING]) == [2, 3]
    assert not h.post(LookupOutcomes(stimulus_id="x", time=h.clock, runs=Runs(42), found=[0]))


# ------------------------------------------------------------------ exact stimuli, phases and reasons
def test_every_move_of_the_gating_carries_its_stimulus_and_marks_the_master() -> None:
    g = Grid()
    g.split()
    assert g.master_dirty()
    g.link(1, "prejob")
    step = g.prepare_linked(1)
    assert g.phase() == "starting"  # the pre-job is being submitted: not its phase yet
    step = g.h.outcomes(only(step, SendSubmit))
    assert {c.stimulus_id for c in step.changes} == {g.sid}
    step = g.h.report(1, None, S.RUNNING)
    assert {c.stimulus_id for c in step.changes} == {step.stimulus_id} and g.master_dirty()
    step = g.h.report(1, None, S.COMPLETED)
    assert {c.stimulus_id for c in step.changes} == {step.stimulus_id}
    assert only(step, SendSubmit).stimulus_id == step.stimulus_id and g.master_dirty()
    step = g.h.outcomes(only(step, SendSubmit))
    for i in range(3):
        g.h.report(g.m, [i], S.RUNNING, state=FINAL_STATE)
    step = g.h.report(g.m, [0, 1, 2], S.COMPLETED)
    assert {c.stimulus_id for c in step.changes} == {step.stimulus_id} and g.master_dirty()
    sid = step.stimulus_id
    g.link(2, "aggregator", sid)
    g.h.outcomes(only(g.prepare_linked(2, sid), SendSubmit))
    step = g.h.report(2, None, S.FAILED, exit_code=1)
    assert {c.stimulus_id for c in step.changes} == {step.stimulus_id} and g.master_dirty()


def test_subjobs_that_cannot_be_submitted_after_the_prejob() -> None:
    g = Grid()
    g.prejob_running()
    step = g.h.report(1, None, S.COMPLETED)
    step = g.h.outcomes(only(step, SendSubmit), accepted=[], rejected=[(0, "full"), (1, "full"), (2, "full")])
    assert g.h.sm.counts(g.m)[S.FAILED] == 3
    step = g.h.outcomes(only(g.h.request(ResubmitRequested, g.m), SendSubmit), accepted=[0, 1, 2])
    assert g.h.sm.counts(g.m)[S.SUBMITTED] == 3


def test_subjobs_none_of_which_could_be_submitted_after_the_prejob_say_why() -> None:
    g = Grid(profile_native=False)
    g.prejob_running()
    step = g.h.report(1, None, S.COMPLETED)
    g.h.outcomes(only(step, SendSubmit), accepted=[], rejected=[(0, "full"), (1, "no"), (2, "no")], native=False)
    assert g.h.sm.counts(g.m)[S.NEW] == 3
    assert g.info(g.m)["reason"] == "no subjob could be submitted after the prejob; first error: full"


def test_a_prejob_killed_by_the_user_names_no_reason() -> None:
    g = Grid()
    g.prejob_running()
    step = g.h.request(KillRequested, 1)
    g.h.killed(only(step, SendKill))
    assert g.info(g.m)["reason"] == "prejob 1 killed; no subjob was started"
    assert g.phase() == "prejob-ended"


def test_a_prejob_resubmitted_after_the_subjobs_started_leaves_the_master_alone() -> None:
    g = Grid()
    g.prejob_running()
    step = g.h.report(1, None, S.COMPLETED)
    g.h.outcomes(only(step, SendSubmit))
    g.h.report(g.m, [0, 1, 2], S.RUNNING)
    assert g.status(g.m) == S.RUNNING
    step = g.h.request(ResubmitRequested, 1)
    assert g.status(g.m) == S.RUNNING and g.phase() == "subjobs"
    g.h.outcomes(only(step, SendSubmit))
    g.h.report(1, None, S.RUNNING)
    assert g.status(g.m) == S.RUNNING and g.phase() == "subjobs"


def test_an_aggregator_resubmitted_after_it_failed_can_complete_the_master() -> None:
    g = Grid()
    g.aggregator_submitted()
    g.h.report(2, None, S.FAILED, exit_code=1)
    assert g.status(g.m) == S.FAILED and g.info(g.m)["partition"]["failed"] is True
    step = g.h.request(ResubmitRequested, 2)
    assert g.phase() == "aggregator"
    g.h.outcomes(only(step, SendSubmit))
    g.h.report(2, None, S.COMPLETED)
    assert g.status(g.m) == S.COMPLETED
    assert g.info(g.m)["partition"]["failed"] is False and g.info(g.m).get("reason") is None


def test_a_master_still_starting_its_prejob_refuses_a_resubmission() -> None:
    h = Harness()
    h.sm.load(5, profile(prejob=True), created=1.0, table=RunTable(2), master=True,
              partition={"phase": "starting", "prejob": 6})
    error = reply(h.request(ResubmitRequested, 5)).error
    assert "its prejob 6 has not completed: the subjobs start once it completes" in str(error)


def test_killing_a_master_kills_its_running_aggregator() -> None:
    g = Grid()
    g.aggregator_submitted()
    g.h.report(2, None, S.RUNNING)
    kills = g.h.request(KillRequested, g.m).of(SendKill)
    assert [k.runs for k in kills] == [Runs(2)]
