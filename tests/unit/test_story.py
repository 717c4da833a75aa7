"""The story log on its own (no loop, no disk): what it keeps, how much, and what touches a job or a subjob.

The end-to-end story of a run submitted, lost, retried and killed is tests/integration/test_story.py; here the
rules that decide which entries are a job's, on hand-made steps.
"""

from __future__ import annotations

from array import array

from orchestrator.core.events import KillOutcomes, KillRequested, RunReport, StatusReport, SubmitOutcomes
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import Prepare, Reply, SendKill
from orchestrator.core.statuses import JobStatus as S
from orchestrator.core.step import Change, Refusal, Step
from orchestrator.runtime.story import Story


def report(sid: str, runs: Runs, status: S) -> StatusReport:
    return StatusReport(stimulus_id=sid, time=1.0, backend="sim", reports=(RunReport(runs, status),))


def test_the_newest_steps_are_kept_and_a_report_that_changed_nothing_is_not() -> None:
    story = Story(3)
    for k in range(5):
        story.record(KillRequested(stimulus_id=f"kill-{k}", time=float(k), targets=((3,),)),
                     Step(f"kill-{k}", instructions=[Reply(stimulus_id=f"kill-{k}")]))
    story.record(report("poll-1", Runs(3, [1]), S.RUNNING), Step("poll-1"))  # a tick that found it as it was
    story.record(KillOutcomes(stimulus_id="kill-4", time=5.0, runs=Runs(3, [1]), killed=[0]), Step("kill-4"))
    told = story.of((3, 1))
    assert [e["stimulus_id"] for e in told if e["kind"] == "event"] == ["kill-3", "kill-4", "kill-4"]
    assert told[-1] == {"stimulus_id": "kill-4", "time": 5.0, "kind": "event", "type": "KillOutcomes",
                        "description": "kill done"}
    assert len(Story(0)) == 0


def test_a_subjob_s_story_has_its_batches_and_its_master_s_requests_a_master_s_its_own() -> None:
    story = Story(100)
    kill = KillRequested(stimulus_id="kill-1", time=1.0, targets=((3,),))
    story.record(kill, Step("kill-1", changes=[Change(3, None, S.RUNNING, S.KILLED, 1.0, "kill-1")],
                            instructions=[Prepare(stimulus_id="kill-1", job=3),
                                          SendKill(stimulus_id="kill-1", backend="sim", runs=Runs(3, range(0, 4)),
                                                   native=True, attempts=[1, 3, 1, 1])]))
    submit = SubmitOutcomes(stimulus_id="submit-2", time=2.0, runs=Runs(3, array("q", [0, 2])), accepted=[1],
                            rejected=[(0, "full")])
    story.record(submit, Step("submit-2", changes=[Change(3, array("q", [0]), S.SUBMITTING, S.FAILED, 2.0, "submit-2"),
                                                   Change(3, None, S.SUBMITTING, S.FAILED, 2.0, "submit-2")],
                              refusals=[Refusal((3, 2), "no", "submit-2", S.NEW, S.RUNNING)],
                              instructions=[Reply(stimulus_id="submit-0", acted=2)]))

    sub1 = [(e["kind"], e["type"], e["description"]) for e in story.of((3, 1))]
    assert sub1 == [("event", "KillRequested", "kill requested"),
                    ("instruction", "SendKill", "kill attempt 3 at sim (one of 4 runs)")]  # not the master's own change
    sub0 = [(e["kind"], e["description"]) for e in story.of((3, 0))]
    assert ("event", "submission rejected: full (native bulk) (one of 2 runs)") in sub0
    assert ("change", "submitting -> failed") in sub0 and ("instruction", "answered: acted on 2") in sub0
    sub2 = [(e["kind"], e["description"]) for e in story.of((3, 2))]
    assert ("refusal", "refused (new -> running): no") in sub2 and ("event", "submission accepted (native bulk) "
                                                                             "(one of 2 runs)") in sub2
    master = [(e["kind"], e["type"], e["description"]) for e in story.of((3,))]
    assert master == [("event", "KillRequested", "kill requested"),
                      ("change", "StatusChanged", "running -> killed"),
                      ("instruction", "Prepare", "split into subjobs and store them"),
                      # its subjobs' outcome is told as the cause of the master's own change, nothing of its runs
                      ("event", "SubmitOutcomes", "about 2 runs of job 3"),
                      ("change", "StatusChanged", "submitting -> failed")]
    assert story.of((4,)) == [] and [e["type"] for e in story.of((3, 9))] == ["KillRequested"]


def test_a_kept_step_holds_its_batches_compactly_and_tells_them_as_they_came() -> None:
    """A million subjobs' steps are kept as ranges and small arrays, without what no story tells
    (a report's states, a reply's value): every entry told of them is the same as of the steps as they came."""
    n = 3000
    odd = [i for i in range(n) if i % 3]  # not consecutive: an array of 4 bytes an index
    attempts = array("q", [2]) * len(odd)
    made = [
        (SubmitOutcomes(stimulus_id="s", time=1.0, runs=Runs(3, array("q", odd)), accepted=list(range(len(odd) - 1)),
                        not_attempted=[len(odd) - 1], states={k: {"seq": 1} for k in range(50)}),
         Step("s", changes=[Change(3, list(odd), S.SUBMITTING, S.SUBMITTED, 1.0, "s"),
                            Change(3, range(n, n + 100), S.NEW, S.SUBMITTING, 1.0, "s")],
              instructions=[SendKill(stimulus_id="s", backend="sim", runs=Runs(3, list(odd)), native=True,
                                     attempts=attempts),
                            SendKill(stimulus_id="s", backend="sim", runs=Runs(3, range(n)), native=False,
                                     attempts=array("q", range(n))),
                            Reply(stimulus_id="s", acted=n, value=list(range(n)))])),
        (StatusReport(stimulus_id="r", time=2.0, backend="sim",
                      reports=(RunReport(Runs(3, odd), S.COMPLETED, 0, state={"seq": 2}, usage={"cpu": 1.0}),
                               RunReport(Runs(3, [0]), S.FAILED, 3, "boom", stderr_tail="Traceback"))),
         Step("r", changes=[Change(3, array("q", odd), S.RUNNING, S.COMPLETED, 2.0, "r")])),
    ]
    asked = [(3,), (3, 0), (3, 1), (3, 2), (3, odd[-1]), (3, n + 5), (3, n + 500)]
    whole = Story(10)
    for event, step in made:
        whole.record(event, step)
    told = {fq: whole.of(fq) for fq in asked}
    assert ("instruction", "kill attempt 2 at sim (one of 2,000 runs)") in [
        (e["kind"], e["description"]) for e in told[(3, 1)]]
    assert [e["description"] for e in told[(3, 0)] if e["kind"] == "event"][-1] == "sim says failed, exit code 3, boom"
    assert "kill attempt 1234 at sim (one of 3,000 runs)" in [e["description"] for e in whole.of((3, 1234))]
    for fq in asked:  # as told from the steps as they came, each on its own
        alone = Story(10, compact=False)
        for event, step in made:
            alone.record(event, step)
        assert alone.of(fq) == told[fq], fq
    (event, step), (report_, _) = whole.steps()
    assert isinstance(step.changes[0].indexes, array) and step.changes[0].indexes.typecode == "I"
    assert step.changes[1].indexes == range(n, n + 100)
    kill, ranged, reply = step.instructions
    assert isinstance(kill, SendKill) and isinstance(kill.runs.indexes, array) and len(kill.attempts) == len(odd)
    assert isinstance(kill.attempts, array) and kill.attempts.typecode == "B" and list(kill.attempts[:2]) == [2, 2]
    assert isinstance(ranged, SendKill) and ranged.attempts == range(n) and isinstance(reply, Reply)
    assert reply.value is None and isinstance(event, SubmitOutcomes) and not event.states
    assert event.accepted == range(len(odd) - 1) and event.not_attempted == [len(odd) - 1]
    assert isinstance(report_, StatusReport) and all(r.state is None and r.usage is None and r.stderr_tail is None
                                                    for r in report_.reports)
