"""``resubmit`` read exactly: which runs, under which stimulus, the master's counter, the refusals' whole
messages, keep_going; and a partitioned master's kill reaching its linked job (core.requests)."""

from __future__ import annotations

from orchestrator.core.events import KillRequested, LinkedAdded, Prepared, ResubmitRequested, SubmitRequested
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import SendKill, SendSubmit
from orchestrator.core.statuses import JobStatus
from orchestrator.core.step import Change

from .harness import Harness, only, profile, reply

S = JobStatus


def ended(h: Harness) -> int:
    """A master of four: completed, failed, killed, held."""
    m = h.add()
    h.submit_all(m, 4)
    h.report(m, [0], S.COMPLETED)
    h.report(m, [1], S.FAILED, exit_code=1)
    h.report(m, [3], S.HELD, verdict="cancelled")
    h.killed(only(h.request(KillRequested, (m, 2)), SendKill))
    return m


def test_resubmitting_a_master_takes_its_failed_runs_and_counts_a_submission() -> None:
    h = Harness()
    m = ended(h)
    assert h.sm.info((m,))["submit_counter"] == 1
    h.tick()
    step = h.request(ResubmitRequested, m)
    send = only(step, SendSubmit)
    assert send.runs == Runs(m, [1]) and send.stimulus_id == step.stimulus_id and send.start == "initial"
    assert send.stop_on_failure is True
    assert step.changes[0] == Change(m, [1], S.FAILED, S.SUBMITTING, h.clock, step.stimulus_id)
    assert {c.stimulus_id for c in step.changes} == {step.stimulus_id}
    assert h.sm.info((m,))["submit_counter"] == 2
    assert h.sm.info((m, 1)).get("reason") is None
    assert m in h.sm.take_dirty()[1]
    r = reply(h.outcomes(send))
    assert r.error is None and r.acted == 1


def test_resubmitting_killed_runs_too_and_subjobs_by_name() -> None:
    h = Harness()
    m = ended(h)
    step = h.request(ResubmitRequested, m, only_failed=False, keep_going=True, start="given")
    send = only(step, SendSubmit)
    assert send.runs == Runs(m, [1, 2]) and send.stop_on_failure is False and send.start == "given"
    h.outcomes(send)
    h.report(m, [1, 2], S.FAILED, exit_code=1)
    step = h.request(ResubmitRequested, (m, 2), (m, 1))
    assert only(step, SendSubmit).runs == Runs(m, [1, 2])
    assert h.sm.info((m,))["submit_counter"] == 2  # subjobs named: not the master's own submission


def test_resubmit_refusals_say_why() -> None:
    h = Harness()
    m = ended(h)
    new = h.add(splits=False)
    cases = {
        (m, 3): f"job {m}.3: is held (use release())",
        (new,): f"job {new}: was never submitted (use submit())",
        (m, 9): f"job {m}.9: no such job",
    }
    for fq, message in cases.items():
        step = h.request(ResubmitRequested, fq)
        assert str(reply(step).error).endswith(message), (fq, str(reply(step).error))
        assert not step.of(SendSubmit) and reply(step).acted == 0
    running = h.add()
    h.submit_all(running, 2)
    error = reply(h.request(ResubmitRequested, (running, 1))).error
    assert str(error).endswith(f"job {running}.1: cannot resubmit a job that is submitted; kill it first, "
                               "then resubmit it")


def test_a_refusal_stops_resubmit_unless_keep_going() -> None:
    h = Harness()
    m = ended(h)
    step = h.request(ResubmitRequested, (m, 3), (m, 1))
    assert not step.of(SendSubmit)
    assert str(reply(step).error) == f"resubmit stopped: job {m}.3: is held (use release())"
    step = h.request(ResubmitRequested, (m, 3), (m, 1), keep_going=True)
    send = only(step, SendSubmit)
    assert send.runs == Runs(m, [1])
    r = reply(h.outcomes(send))
    assert r.acted == 1 and r.error is None  # keep_going forgives it


def test_a_refusal_after_chosen_runs_still_resubmits_them_and_reports_it() -> None:
    h = Harness()
    m = ended(h)
    step = h.request(ResubmitRequested, (m, 1), (m, 3))
    send = only(step, SendSubmit)
    assert send.runs == Runs(m, [1])
    r = reply(h.outcomes(send))
    assert r.acted == 1 and f"job {m}.3: is held (use release())" in str(r.error)


def test_a_master_with_nothing_to_resubmit() -> None:
    h = Harness()
    m = h.add()
    h.submit_all(m, 2)
    h.report(m, [0, 1], S.COMPLETED)
    step = h.request(ResubmitRequested, m)
    assert not step.of(SendSubmit)
    r = reply(step)
    assert r.error is None and r.acted == 0
    assert h.sm.info((m,))["submit_counter"] == 2


def test_resubmitting_after_the_postprocessors_failed_the_master_clears_their_verdict() -> None:
    from orchestrator.core.events import PostprocessDone
    from orchestrator.core.instructions import RunPostprocess

    h = Harness()
    m = h.add(postprocess=True)
    h.submit_all(m, 2)
    step = h.report(m, [0], S.COMPLETED)
    step = h.report(m, [1], S.FAILED, exit_code=1)
    h.post(PostprocessDone(stimulus_id=only(step, RunPostprocess).stimulus_id, time=h.clock, job=m,
                           error="merge failed"))
    assert h.sm.info((m,))["reason"] == "merge failed"
    h.sm.take_dirty()
    step = h.request(ResubmitRequested, m)
    assert h.sm.info((m,)).get("reason") is None
    h.outcomes(only(step, SendSubmit))
    step = h.report(m, [1], S.COMPLETED)
    assert h.status(m) == S.COMPLETED


# ------------------------------------------------------------------ a partitioned master's kill
def test_killing_a_master_kills_its_running_prejob() -> None:
    h = Harness()
    m = h.add(prejob=True, aggregator=True)
    step = h.request(SubmitRequested, m)
    h.prepared(step, m, 2)
    h.post(LinkedAdded(stimulus_id=step.stimulus_id, time=h.clock, job=1, master=m, role="prejob",
                       profile=profile(splits=False)))
    h.outcomes(only(h.post(Prepared(stimulus_id=step.stimulus_id, time=h.clock, job=1)), SendSubmit))
    h.report(1, None, S.RUNNING)
    step = h.request(KillRequested, m)
    kills = step.of(SendKill)
    assert [k.runs for k in kills] == [Runs(1)]
    h.killed(kills[0])
    assert h.status(1) == S.KILLED
