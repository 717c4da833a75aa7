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
