"""Small parts of the core no other unit test reached: the public errors, id ranges, a step's changes as
events, and the state machine's queries."""

from __future__ import annotations

import pytest

from orchestrator.core.errors import (
    JobError,
    NotOwnerError,
    RepositoryError,
    RepositoryHeldError,
    UnknownJobError,
    WaitTimeout,
    leaves,
)
from orchestrator.core.events import PrepareFailed, RetryDue, StatusChanged, SubmitRequested
from orchestrator.core.ids import Runs, parse_id_range
from orchestrator.core.instructions import Reply, SendSubmit
from orchestrator.core.runlog import parse_log
from orchestrator.core.statuses import JobStatus
from orchestrator.core.step import Change, Refusal, Step
from orchestrator.core.table import RunExtra, RunTable

from .harness import Harness, limits, only, profile

S = JobStatus
FORMS = "3, 3.1, 3-5, 3.0-99 or 3.[0-9,12]"


# ------------------------------------------------------------------ errors
def test_job_error_message() -> None:
    e = JobError("refused", fqid="3.1", field="backend")
    assert str(e) == "job 3.1: refused [field backend]" and e.fqid == "3.1" and e.field == "backend"
    assert str(JobError("refused")) == "refused"
    assert str(JobError("refused", field="")) == "refused"


def test_not_owner_error() -> None:
    e = NotOwnerError("3", owner="ann", user="bob")
    assert str(e) == "job 3 belongs to ann; you are bob"
    assert (e.fqid, e.field, e.owner, e.user) == ("3", None, "ann", "bob")
    assert isinstance(e, JobError)


def test_unknown_job_error_is_a_key_error_with_a_plain_message() -> None:
    e = UnknownJobError("no job 3.7", fqid="3.7", field="f")
    assert str(e) == "no job 3.7" and e.fqid == "3.7" and e.field == "f"
    assert isinstance(e, KeyError) and isinstance(e, JobError)
    plain = UnknownJobError("no job 4")
    assert plain.fqid is None and plain.field is None and str(plain) == "no job 4"


def test_repository_errors_keep_what_they_name() -> None:
    leader: dict[str, object] = {"pid": 4}
    e = RepositoryHeldError("held", leader)
    leader["pid"] = 5
    assert str(e) == "held" and e.leader == {"pid": 4}
    assert RepositoryHeldError("held").leader is None
    assert RepositoryHeldError("held", {}).leader is None
    r = RepositoryError("bad file", path="/x")
    assert str(r) == "bad file" and r.path == "/x"
    assert RepositoryError("bad").path is None


def test_wait_timeout_names_the_first_ten_jobs() -> None:
    one = WaitTimeout(["1"], 2.5)
    assert str(one) == "job 1 still active after 2.5 s" and one.active == ["1"] and one.timeout == 2.5
    assert str(WaitTimeout(["1", "2"], None)) == "jobs 1, 2 still active"
    ten = [str(i) for i in range(10)]
    assert str(WaitTimeout(ten, 1.0)) == "jobs 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 still active after 1 s"
    eleven = [str(i) for i in range(11)]
    assert str(WaitTimeout(eleven, 2)) == "jobs 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ... (11 in all) still active after 2 s"
    many = [str(i) for i in range(12)]
    e = WaitTimeout(many, 3)
    assert str(e) == "jobs 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ... (12 in all) still active after 3 s"
    many.append("x")
    assert e.active == [str(i) for i in range(12)]
    assert isinstance(e, TimeoutError)


def test_leaves_of_nested_groups() -> None:
    a, b, c = ValueError("a"), KeyError("b"), TypeError("c")
    group = ExceptionGroup("g", [a, ExceptionGroup("h", [b, ExceptionGroup("i", [c])])])
    assert leaves(group) == [a, b, c]
    assert leaves(ExceptionGroup("g", [a])) == [a]


# ------------------------------------------------------------------ id ranges
def test_plain_ids() -> None:
    assert parse_id_range(" 3 ") == [((3,), None)]
    assert parse_id_range("3.1") == [((3, 1), None)]


def test_ranges_of_top_level_jobs() -> None:
    assert parse_id_range("3-5") == [((3,), None), ((4,), None), ((5,), None)]
    assert parse_id_range("[5,3]") == [((3,), None), ((5,), None)]
    assert parse_id_range("4,2-3,3") == [((2,), None), ((3,), None), ((4,), None)]


def test_ranges_of_subjobs() -> None:
    assert parse_id_range("3.0-99") == [((3,), range(0, 100))]
    assert parse_id_range("3.[0-2,4]") == [((3,), (0, 1, 2, 4))]
    assert parse_id_range("3.[ 1 - 2 , 7 ]") == [((3,), (1, 2, 7))]
    assert parse_id_range("3.5-5") == [((3,), range(5, 6))]
    assert parse_id_range("3.1.[0,1]") == [((3, 1), range(0, 2))]
    assert parse_id_range("3.[5]") == [((3,), range(5, 6))]
    assert parse_id_range("3.1,4") == [((3,), (1, 4))]


@pytest.mark.parametrize(("text", "detail"), [
    ("x", f"expected e.g. {FORMS}"),
    ("3.x", f"expected e.g. {FORMS}"),
    ("3.[0-2", f"expected e.g. {FORMS}"),
    ("3.a-2", f"expected e.g. {FORMS}"),
    ("3.0-b", f"expected e.g. {FORMS}"),
    ("x.0-2", f"expected e.g. {FORMS}"),
    ("3.5-4", f"5-4 is empty; expected e.g. {FORMS}"),
    ("3.[1, 5-4]", f"5-4 is empty; expected e.g. {FORMS}"),
    ("3.-1-2", f"expected e.g. {FORMS}"),
])
def test_bad_ranges(text: str, detail: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_id_range(text)
    assert str(caught.value) == f"not a job id or range: {text!r} ({detail})"


# ------------------------------------------------------------------ a step's parts
def test_change_as_event_and_refusal_text() -> None:
    change = Change(3, (1, 2), S.RUNNING, S.COMPLETED, 12.5, "s-1", forced=True)
    assert change.as_event() == StatusChanged(stimulus_id="s-1", time=12.5, changed=Runs(3, (1, 2)),
                                              old=S.RUNNING, new=S.COMPLETED, forced=True)
    assert len(change) == 2 and list(change.fqids()) == [(3, 1), (3, 2)]
    whole = Change(4, None, S.NEW, S.SUBMITTING, 1.0, "s-2")
    assert whole.as_event().forced is False and whole.as_event().ids == ((4,),) and len(whole) == 1
    assert str(Refusal((3, 1), "illegal transition", "s")) == "job 3.1: illegal transition"


# ------------------------------------------------------------------ the state machine's queries
def test_queries_of_a_master_and_its_subjobs() -> None:
    h = Harness()
    job = h.add()
    single = h.add(splits=False)
    assert h.sm.job_ids() == [job, single]
    assert h.sm.status_if_known((job,)) == S.NEW
    assert h.sm.status_if_known((9,)) is None
    assert h.sm.status_if_known((job, 0)) is None
    assert h.sm.indexes(single, [S.NEW]) == []
    step = h.request(SubmitRequested, job)
    step = h.prepared(step, job, 3)
    send = only(step, SendSubmit)
    assert h.sm.active((job,)) and h.sm.active((job, 1))
    assert h.sm.indexes(job, [S.SUBMITTING]) == [0, 1, 2]
    h.outcomes(send, accepted=[0, 1], rejected=[(2, "full")])
    assert h.sm.status_if_known((job, 0)) == S.SUBMITTED
    assert h.sm.indexes(job, [S.SUBMITTED]) == [0, 1]
    assert h.sm.indexes(job, [S.FAILED]) == [2]
    assert h.sm.indexes(job, [S.FAILED, S.SUBMITTED]) == [0, 1, 2]
    assert h.sm.active((job, 0)) and not h.sm.active((job, 2))
    assert not h.sm.active((9,)) and not h.sm.active((job, 7)) and not h.sm.active((single,))
    h.report(job, [0, 1], S.COMPLETED)
    assert not h.sm.active((job, 0)) and not h.sm.active((job,))
    h.sm.forget(single)
    assert h.sm.job_ids() == [job] and (single,) not in h.sm
    h.sm.forget(single)  # forgetting twice is harmless


def test_mark_dirty_gives_runs_back_to_the_writer() -> None:
    h = Harness()
    job = h.add()
    h.submit_all(job, 3)
    h.sm.take_dirty()
    assert h.sm.take_dirty() == ({}, set())
    h.sm.mark_dirty(job, {1})
    assert h.sm.take_dirty() == ({job: {1}}, {job})
    h.sm.mark_dirty(job, None)
    assert h.sm.take_dirty() == ({job: None}, {job})
    h.sm.mark_dirty(42, {1})
    assert h.sm.take_dirty() == ({}, set())


def test_a_step_is_true_when_it_did_anything() -> None:
    assert not Step("s")
    assert Step("s", changes=[Change(1, None, S.NEW, S.SUBMITTING, 1.0, "s")])
    assert Step("s", refusals=[Refusal((1,), "no", "s")])
    assert Step("s", instructions=[Reply(stimulus_id="s")])
    assert len(Change(1, None, S.NEW, S.SUBMITTING, 1.0, "s")) == 1
    assert len(Change(1, (), S.NEW, S.SUBMITTING, 1.0, "s")) == 0


def test_statuses_of_a_master_and_of_a_single_job() -> None:
    h = Harness()
    m = h.add()
    single = h.add(splits=False)
    assert h.sm.statuses(single) == b""
    h.submit_all(m, 2)
    h.report(m, [1], S.RUNNING)
    assert h.sm.statuses(m) == bytes([S.SUBMITTED.code, S.RUNNING.code])


def test_info_of_a_master_a_subjob_and_a_single_job() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    info = h.sm.info((m,))
    assert set(info) == {"timestamps", "submit_counter"}
    assert info["submit_counter"] == 1 and info["timestamps"]["new"] == 1000.0
    assert "partition" not in info and info.get("reason") is None
    assert h.sm.info((m, 1))["submit_counter"] == 1 and "partition" not in h.sm.info((m, 1))
    single = h.add(splits=False)
    step = h.request(SubmitRequested, single)
    h.post(PrepareFailed(stimulus_id=step.stimulus_id, time=h.clock, job=single,
                         error=JobError("no such exe", fqid=str(single))))
    assert h.sm.info((single,)).get("reason") is None and h.status(single) == S.NEW


def test_a_single_jobs_info_falls_back_to_its_own_reason() -> None:
    h = Harness()
    h.sm.load(4, profile(splits=False), created=3.0, top={"reason": "why"})
    assert h.sm.info((4,))["reason"] == "why"
    assert h.sm.info((4,))["timestamps"] == {"new": 3.0}
    h.sm.load(5, profile(), created=1.0, top={"reason": "top"}, master=True,
              table=RunTable.restore(bytearray([S.FAILED.code]), [1], {}, {0: RunExtra(reason="own")}))
    assert h.sm.info((5, 0))["reason"] == "own"
    assert h.sm.info((5,))["reason"] == "top"
    h.sm.load(6, profile(splits=False), created=1.0, top={"reason": "top"},
              table=RunTable.restore(bytearray([S.FAILED.code]), [1], {}, {0: RunExtra(reason="own")}))
    assert h.sm.info((6,))["reason"] == "own"


def test_the_run_log_names_the_host() -> None:
    log = parse_log("1.0 START 12 node7 x\n2.0 EXIT 3\n3.0 END 0\n")
    assert log.host == "node7" and log.started == 1.0 and log.exit_code == 3 and log.ended == 3.0
    assert parse_log("1.0 START 12 node8").host == "node8"
    assert parse_log("1.0 START 12 -").host is None
    assert parse_log("1.0 START 12").host is None
    assert parse_log("1.0 START").host is None


def test_a_retry_due_sends_the_waiting_and_the_failed_runs_under_its_stimulus() -> None:
    h = Harness()
    m = h.add(limits=limits(early=1, unhandled=1))
    h.submit_all(m, 3)
    send = only(h.report(m, [0], S.FAILED, exit_code=1), SendSubmit)
    h.outcomes(send, accepted=[], rejected=[(0, "unreachable")])  # a refused retry: it waits, submitting
    h.outcomes(only(h.report(m, [2], S.FAILED, exit_code=1), SendSubmit))
    assert not h.report(m, [2], S.FAILED, exit_code=1).of(SendSubmit)  # its early retry used up: failed
    assert (h.status(m, 0), h.status(m, 2)) == (S.SUBMITTING, S.FAILED)
    h.tick(5)
    step = h.post(RetryDue(stimulus_id="due", time=h.clock, runs=Runs(m, [2, 0])))
    send = only(step, SendSubmit)
    assert send.stimulus_id == "due" and send.runs == Runs(m, [0, 2]) and send.start == "resume"
    assert [(c.indexes, c.stimulus_id) for c in step.changes] == [([2], "due")]
    assert not h.post(RetryDue(stimulus_id="x", time=h.clock, runs=Runs(99)))


def test_a_masters_times_span_its_subjobs() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 3)
    h.report(m, [0], S.HELD, verdict="cancelled")
    h.tick(2)
    h.report(m, [1], S.HELD, verdict="cancelled")
    assert h.sm.info((m,))["timestamps"]["held"] == h.clock  # the latest
    f = h.add()
    h.submit_all(f, 2)
    h.report(f, [0], S.FAILED, exit_code=1)
    failed_at = h.clock
    h.tick(3)
    h.report(f, [1], S.COMPLETED)
    ts = h.sm.info((f,))["timestamps"]
    assert ts["final"] == h.clock and ts["completed"] == h.clock and ts["failed"] == failed_at
    single_end = Harness()
    s = single_end.add()
    single_end.submit_all(s, 2)
    single_end.report(s, [0], S.COMPLETED)
    assert "final" not in single_end.sm.info((s,))["timestamps"]
    single_end.tick(4)
    single_end.report(s, [1], S.COMPLETED)
    ts = single_end.sm.info((s,))["timestamps"]
    assert ts["final"] == single_end.clock and ts["completed"] == single_end.clock and "failed" not in ts
