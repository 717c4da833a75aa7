"""Monitoring and the run's end: reports, the retry policy, hold and release, kill, lost runs, force_status."""

from __future__ import annotations

from orchestrator.core.actions import Rule
from orchestrator.core.analyser import Limits
from orchestrator.core.events import (
    ForceStatusRequested,
    KillRequested,
    ReleaseRequested,
    RemoveRequested,
    RetryDue,
    RunLost,
    RunReport,
    RunsSilent,
    Started,
    StatusReport,
)
from orchestrator.core.ids import Runs
from orchestrator.core.instructions import (
    AdjustRun,
    Lookup,
    Persist,
    Reply,
    ScheduleRetry,
    SendKill,
    SendSubmit,
    Unwatch,
)
from orchestrator.core.statuses import JobStatus
from orchestrator.core.step import Step

from .harness import Harness, limits, log, only, profile, reply

S = JobStatus


def running_master(h: Harness, n: int = 3, **kw: object) -> int:
    job = h.add(profile(**kw))  # type: ignore[arg-type]
    h.submit_all(job, n)
    h.report(job, list(range(n)), S.RUNNING)
    return job


def test_no_news_is_no_change_and_no_record() -> None:
    h = Harness()
    job = running_master(h)
    step = h.report(job, [0, 1, 2], S.RUNNING)
    assert not step and h.sm.take_dirty() != ({}, set())  # (the earlier moves are dirty, this one added none)
    h.report(job, [0], S.HELD)
    for _ in range(3):  # a held run reported held each tick: one entry, no refusal (issue: history grew)
        step = h.report(job, [0], S.HELD)
        assert not step
    assert len(h.sm.info((job, 0))["history"]) == 1


def test_a_report_the_table_forbids_is_recorded_not_applied() -> None:
    h = Harness()
    job = running_master(h)
    h.report(job, [0], S.COMPLETED)
    step = h.report(job, [0], S.RUNNING)
    assert [r.reason for r in step.refusals] == ["illegal transition completed -> running"]
    assert h.status(job, 0) == S.COMPLETED
    assert h.sm.info((job, 0))["refused"] == ["completed->running: illegal transition completed -> running"]


def test_failure_within_the_limits_is_retried_at_once_with_its_arguments() -> None:
    h = Harness()
    job = running_master(h, wrapper=True, limits=limits(handled=2, early_seconds=0))
    h.tick(100)
    step = h.report(job, [1], S.FAILED, exit_code=3,
                    log=log("1000 START 1", "1090 RETRY 7 x", "1090 EXIT 3", "1090 END 3"))
    send = only(step, SendSubmit)
    assert send.runs == Runs(job, [1]) and send.start == "resume" and Persist in map(type, step.instructions)
    assert h.status(job, 1) == S.SUBMITTING and h.sm.attempt((job, 1)) == 2
    info = h.sm.info((job, 1))
    assert info["retry_args"] == ["7", "x"] and info["counters"] == {"late_handled": 1}
    assert info["history"][-1]["action"] == "retry" and info["history"][-1]["verdict"] == "late_handled"
    assert [c.new for c in step.changes if c.indexes == [1]] == [S.FAILED, S.SUBMITTING]
    h.outcomes(send)
    assert h.status(job, 1) == S.SUBMITTED


def test_past_the_limit_the_run_fails_and_says_which_limit() -> None:
    h = Harness()
    job = running_master(h, wrapper=True, limits=limits(early=1))
    for attempt in (1, 2):
        step = h.report(job, [0], S.FAILED, exit_code=1, log=log("1000 START 1", "1000 EXIT 1", "1000 END 1"))
        if attempt == 1:
            h.outcomes(only(step, SendSubmit))
            h.report(job, [0], S.RUNNING)
    assert h.status(job, 0) == S.FAILED and not step.of(SendSubmit)
    info = h.sm.info((job, 0))
    assert info["history"][-1]["limit"] == "max_early" and "max_early=1 reached" in info["reason"]


def test_a_completed_run_that_left_an_output_pattern_unmatched_fails_unless_the_job_says_not() -> None:
    ended = log("1000 START 1", "1000 EXIT 0", "1000 NOMATCH *.root", "1000 END 0")
    for strict, expected in ((True, S.FAILED), (False, S.COMPLETED)):
        h = Harness()
        job = running_master(h, wrapper=True, fail_on_missing_output=strict)
        step = h.report(job, [0], S.COMPLETED, exit_code=0, log=ended)
        assert h.status(job, 0) == expected and not step.of(SendSubmit)
        reason = h.sm.info((job, 0)).get("reason")
        assert reason == ("output file pattern '*.root' matched nothing" if strict else None)


def test_an_infrastructure_fault_is_retried_on_its_own_budget() -> None:
    h = Harness()
    job = running_master(h, wrapper=True, limits=Limits(0, 0, 0, 60.0, max_infrastructure=1))
    step = h.report(job, [0], S.FAILED, log=log("1000 START 1"))  # the wrapper never ended: worker level
    h.outcomes(only(step, SendSubmit))
    assert h.sm.info((job, 0))["counters"] == {"infrastructure:early": 1}
    h.report(job, [0], S.RUNNING)
    step = h.report(job, [0], S.FAILED, log=log("1000 START 1"))
    assert h.status(job, 0) == S.FAILED and not step.of(SendSubmit)
    assert h.sm.info((job, 0))["history"][-1]["limit"] == "max_infrastructure"


def test_two_runs_retried_from_one_report_each_find_their_outcome() -> None:
    """One status report ends two runs of a job (separate reports, as for runs whose logs were read): each
    retry is its own SendSubmit under the report's stimulus id, and each outcome moves its own runs."""
    h = Harness()
    job = running_master(h, wrapper=True, limits=limits(early=1))
    crashed = log("1000 START 1")
    step = h.post(StatusReport(stimulus_id=h.sid("poll"), time=h.clock, backend="sim",
                               reports=(RunReport(Runs(job, [2]), S.FAILED, log=crashed),
                                        RunReport(Runs(job, [0]), S.FAILED, log=crashed))))
    sends = step.of(SendSubmit)
    assert [list(s.runs.indexes or ()) for s in sends] == [[2], [0]] and len({s.stimulus_id for s in sends}) == 1
    for send in sends:  # answered one after the other, in the order they were sent
        h.outcomes(send)
    assert [h.status(job, i) for i in range(3)] == [S.SUBMITTED, S.RUNNING, S.SUBMITTED]


def test_stderr_tail_is_quoted_in_an_application_failure() -> None:
    h = Harness()
    job = running_master(h, wrapper=True)
    h.report(job, [0], S.FAILED, exit_code=127, stderr_tail="sh: 1: foo: not found",
             log=log("1000 START 1", "1000 EXIT 127", "1000 END 127"))
    assert h.sm.info((job, 0))["reason"].endswith("stderr: sh: 1: foo: not found")


def test_hold_then_release_with_and_without_new_arguments() -> None:
    h = Harness()
    job = running_master(h, wrapper=True)
    h.report(job, [0], S.COMPLETED, log=log("1000 START 1", "1001 HOLD 5 x", "1001 EXIT 0", "1001 END 0"))
    assert h.status(job, 0) == S.HELD and h.status(job) == S.HELD or h.status(job) == S.RUNNING
    step = h.request(ReleaseRequested, (job, 0))
    send = only(step, SendSubmit)
    assert send.start == "resume" and h.status(job, 0) == S.SUBMITTING
    assert h.sm.retry_args((job, 0)) == ["5", "x"]  # the hold's data comes back as the retry arguments
    assert reply(h.outcomes(send)).error is None
    error = reply(h.request(ReleaseRequested, (job, 0))).error
    assert error is not None and "only held jobs" in str(error)


def test_release_with_arguments_replaces_the_holds() -> None:
    h = Harness()
    job = running_master(h, wrapper=True)
    h.report(job, [2], S.COMPLETED, log=log("1000 START 1", "1001 HOLD 5", "1001 EXIT 0", "1001 END 0"))
    h.request(ReleaseRequested, job, retry_args=("42",))
    assert h.sm.retry_args((job, 2)) == ["42"]


def test_kill_master_kills_every_active_subjob_and_final_ones_stay() -> None:
    h = Harness()
    job = running_master(h, n=4)
    h.report(job, [0], S.COMPLETED)
    h.report(job, [1], S.HELD)
    send = only(h.request(KillRequested, job), SendKill)
    assert list(send.runs.indexes or ()) == [1, 2, 3]
    h.report(job, [3], S.COMPLETED)  # ended meanwhile: it keeps its ending
    step = h.killed(send)
    assert [JobStatus.from_code(c).value for c in h.sm.statuses(job)] == ["completed", "killed", "killed",
                                                                            "completed"]
    assert reply(step).acted == 3


def test_kill_refusals_and_no_ops() -> None:
    h = Harness()
    new = h.add(profile(splits=False))
    error = reply(h.request(KillRequested, new)).error
    assert error is not None and "never submitted" in str(error) and str(error).startswith("kill stopped")
    job = running_master(h, n=1)
    h.report(job, [0], S.COMPLETED)
    r = reply(h.request(KillRequested, job))
    assert r.error is None and r.acted == 0  # killing a final job is a no-op


def test_slice_kill_follows_keep_going() -> None:
    h = Harness()
    new = h.add(profile(splits=False))
    job = running_master(h, n=2)
    step = h.request(KillRequested, new, job, keep_going=False)
    assert reply(step).error is not None and not step.of(SendKill)  # stopped at the first refusal
    step = h.request(KillRequested, new, job, keep_going=True)
    send = only(step, SendKill)
    assert not step.of(Reply)
    step = h.killed(send)
    assert reply(step).error is None and h.status(job) == S.KILLED


def test_a_lost_run_is_killed_where_reachable_and_judged_at_orchestrator_level() -> None:
    h = Harness()
    job = running_master(h, wrapper=True, limits=limits(unhandled=1))
    step = h.post(RunLost(stimulus_id="lost-1", time=h.tick(), runs=Runs(job, [0]), reason="no answer"))
    kinds = [type(i).__name__ for i in step.instructions]
    assert kinds.index("SendKill") < kinds.index("SendSubmit")  # the old run is stopped before its retry
    entry = h.sm.info((job, 0))["history"][-1]
    assert entry["level"] == "orchestrator" and entry["verdict"] == "late_unhandled"
    kill = only(step, SendKill)
    h.killed(kill)
    assert h.status(job, 0) == S.SUBMITTING  # the kill of a lost run moves nothing


def test_silence_is_lost_once_it_lasted_lost_after_and_only_for_the_attempt_watched() -> None:
    """The runtime reports silence (``RunsSilent``); the core decides: lost after ``lost_after`` (600 s by default),
    retried as late unhandled and killed where reachable; silence about an attempt before, or shorter, is no news."""
    h = Harness()
    job = running_master(h, n=2, wrapper=True, limits=limits(unhandled=1))
    now = h.tick()

    def silent(seconds: float, attempts: tuple[int, ...] = (1, 1), sid: str = "silent-1") -> Step:
        return h.post(RunsSilent(stimulus_id=sid, time=now, backend="sim", runs=Runs(job, [0, 1]), attempts=attempts,
                                 since=now - seconds, reason="no answer from backend sim"))

    assert not silent(599.0)
    assert not silent(3600.0, attempts=(0, 2))  # not the attempts the runs are at
    step = silent(600.0)
    kill = only(step, SendKill)
    assert list(kill.runs) == [(job, 0), (job, 1)] and list(kill.attempts) == [1, 1]
    assert list(only(step, SendSubmit).runs) == [(job, 0), (job, 1)]
    assert [type(i).__name__ for i in step.instructions].index("SendKill") < \
        [type(i).__name__ for i in step.instructions].index("SendSubmit")
    entry = h.sm.info((job, 1))["history"][-1]
    assert (entry["level"], entry["verdict"], entry["attempt"]) == ("orchestrator", "late_unhandled", 1)
    assert h.sm.info((job, 1))["reason"] == "no answer from backend sim"
    assert not silent(3600.0, sid="silent-2")  # about attempt 1 still: the runs are at attempt 2 now


def test_a_short_silence_of_a_custom_lost_after_is_lost() -> None:
    h = Harness(lost_after=0.5)
    job = running_master(h, n=1, wrapper=True, limits=limits(unhandled=1))
    now = h.tick()
    step = h.post(RunsSilent(stimulus_id="silent-1", time=now, backend="sim", runs=Runs(job, [0]), attempts=(1,),
                             since=now - 0.5, reason="no answer"))
    assert step.of(SendKill) and h.status(job, 0) == S.SUBMITTING


def test_a_retry_the_backend_refuses_waits_and_is_sent_again_within_the_limit() -> None:
    """A lost run's retry refused (the backend is still unreachable): judged like the loss, not failed; it stays
    submitting and is sent again once its pause is over; past the limit it fails with the refusal's reason."""
    h = Harness()
    job = running_master(h, wrapper=True, limits=limits(unhandled=2))
    step = h.post(RunLost(stimulus_id="lost-1", time=h.tick(), runs=Runs(job, [0]), reason="no answer"))
    step = h.outcomes(only(step, SendSubmit), rejected=[(0, "host unreachable")])
    assert h.status(job, 0) == S.SUBMITTING
    pause = only(step, ScheduleRetry)
    assert pause.runs == Runs(job, [0]) and pause.at > h.clock
    step = h.post(RetryDue(stimulus_id=pause.stimulus_id, time=h.tick(3), runs=pause.runs))
    again = only(step, SendSubmit)
    assert again.runs == Runs(job, [0])
    step = h.outcomes(again, rejected=[(0, "host unreachable")])  # the limit (2: the loss, one refusal) is used up
    assert not step.of(ScheduleRetry) and h.status(job, 0) == S.FAILED
    assert "host unreachable" in (h.sm.info((job, 0))["reason"] or "")


def test_force_status_moves_stuck_jobs_on_record_and_kills_active_ones_first() -> None:
    h = Harness()
    job = running_master(h, n=3)
    h.report(job, [0], S.COMPLETED)
    h.report(job, [1], S.HELD)
    step = h.request(ForceStatusRequested, job, status=S.FAILED)
    assert only(step, Unwatch).runs == Runs(job, [1])  # held: forced now, monitoring stops
    send = only(step, SendKill)
    assert send.runs == Runs(job, [2])
    step = h.killed(send)
    assert [JobStatus.from_code(c).value for c in h.sm.statuses(job)] == ["completed", "failed", "failed"]
    assert h.sm.info((job, 2))["history"][-1]["verdict"] == "forced" and reply(step).error is None
    single = h.add(profile(splits=False))
    h.request(ForceStatusRequested, single, status=S.COMPLETED)
    assert h.status(single) == S.COMPLETED


def test_force_true_leaves_the_backend_alone() -> None:
    h = Harness()
    job = running_master(h, n=2)
    step = h.request(ForceStatusRequested, job, status=S.COMPLETED, force=True)
    assert not step.of(SendKill) and only(step, Unwatch).runs == Runs(job, [0, 1])
    assert h.status(job) == S.COMPLETED


def test_remove_only_final_or_new_toplevel_jobs() -> None:
    h = Harness()
    job = running_master(h, n=1)
    assert "kill it first" in str(reply(h.request(RemoveRequested, job)).error)
    assert "on its own" in str(reply(h.request(RemoveRequested, (job, 0))).error)
    h.report(job, [0], S.COMPLETED)
    assert reply(h.request(RemoveRequested, job)).error is None and (job,) not in h.sm


def test_started_looks_up_interrupted_runs_or_leaves_them_new() -> None:
    h = Harness()
    looked = h.add(profile(lookup=True))
    step = h.request(__import__("orchestrator.core.events", fromlist=["SubmitRequested"]).SubmitRequested, looked)
    h.prepared(step, looked, 2)  # a crash here: both are on disk as submitting
    blind = h.add(profile(lookup=False))
    step = h.request(__import__("orchestrator.core.events", fromlist=["SubmitRequested"]).SubmitRequested, blind)
    h.prepared(step, blind, 1)
    step = h.post(Started(stimulus_id="start", time=h.tick()))
    assert only(step, Lookup).runs == Runs(looked, [0, 1])
    assert h.status(blind, 0) == S.NEW and "interrupted by a restart" in h.sm.info((blind, 0))["reason"]


# ------------------------------------------------------------------ a run's times come from its log
def test_a_runs_times_are_those_of_its_log_and_a_masters_end_only_once_final() -> None:
    h = Harness()
    job = h.add(profile(wrapper=True))
    h.submit_all(job, 3)
    h.tick(50)
    h.report(job, [0, 1, 2], S.RUNNING, started=1010.0)  # the driver knew when they started
    stamps = h.sm.info((job, 0))["timestamps"]
    assert stamps["running"] == 1010.0
    h.tick(100)  # the ends are seen late; their logs say when they happened
    h.report(job, [0], S.COMPLETED, exit_code=0, log=log("1011 START 1", "1020 EXIT 0", "1021 END 0"))
    assert h.sm.info((job, 0))["timestamps"] == {"new": 1000.0, "submitting": 1000.0, "submitted": 1000.0,
                                                 "running": 1011.0, "final": 1021.0, "completed": 1021.0}
    top = h.sm.info((job,))["timestamps"]
    assert top["running"] == 1010.0 and not {"final", "completed", "failed", "killed"} & top.keys()
    h.report(job, [1], S.FAILED, exit_code=3, ended=1030.0, started=1012.0)  # a driver's own record
    h.report(job, [2], S.KILLED, log=log("1013 START 1"))  # no end line: the time it was seen stands
    one = h.sm.info((job, 1))["timestamps"]
    assert one["running"] == 1012.0 and one["final"] == one["failed"] == 1030.0
    two = h.sm.info((job, 2))["timestamps"]
    assert two["running"] == 1013.0 and two["final"] == two["killed"] == h.clock
    top = h.sm.info((job,))["timestamps"]
    assert top["final"] == h.clock and top["completed"] == 1021.0 and top["failed"] == 1030.0
    assert top["killed"] == h.clock and top["running"] == 1010.0


def test_an_end_before_the_start_is_not_believed_and_a_lost_run_has_no_log_times() -> None:
    h = Harness()
    job = h.add(profile(wrapper=True))
    h.submit_all(job, 2)
    h.tick(10)
    h.report(job, [0], S.FAILED, exit_code=1, log=log("1005 START 1", "1004 END 1"))
    stamps = h.sm.info((job, 0))["timestamps"]
    assert stamps["running"] == 1005.0 and stamps["final"] == h.clock
    h.report(job, [1], S.FAILED, verdict="lost", log=log("1003 START 1", "1004 END 1"))
    assert h.sm.info((job, 1))["timestamps"]["final"] == h.clock and "running" not in h.sm.info((job, 1))["timestamps"]


# ------------------------------------------------------------------ checkpoint restarts and the action table
STATE = {"seq": 5, "label": "0.0:5", "final": False, "time": 1.0}


def _again(h: Harness, job: int, step: object, i: int) -> None:
    """The retry's submission taken, the run running again."""
    h.outcomes(only(step, SendSubmit))  # type: ignore[arg-type]
    h.report(job, [i], S.RUNNING)


def test_a_checkpointed_run_resumes_from_its_state_until_it_restarted_too_often_from_it() -> None:
    h = Harness()
    job = running_master(h, 2, wrapper=True, checkpointable=True, max_restarts=2)
    h.report(job, [0], S.RUNNING, state=STATE)
    for restart in (1, 2):
        step = h.report(job, [0], S.FAILED, log=log("1000 START 1"))  # the worker died: a cause outside the job
        info = h.sm.info((job, 0))
        entry = info["history"][-1]
        assert entry["action"] == "retry" and entry["state"] == "0.0:5" and entry["restart"] == restart
        assert "limit" not in entry and info["checkpoint"]["restarts"] == restart
        assert info["checkpoint"]["restart_seq"] == 5
        assert info["reason"] == f"{entry['reason']}; resumed from state 0.0:5"
        assert only(step, SendSubmit).start == "resume"
        _again(h, job, step, 0)
    step = h.report(job, [0], S.FAILED, log=log("1000 START 1"))
    assert h.status(job, 0) == S.FAILED and not [i for i in step.instructions if isinstance(i, SendSubmit)]
    info = h.sm.info((job, 0))
    assert info["reason"].endswith("restarted 2 time(s) from state 0.0:5 without a new save: "
                                   "max_restarts_per_state=2 reached"), info["reason"]
    entry = info["history"][-1]
    assert entry["action"] == "failed" and entry["limit"] == "max_restarts_per_state" and entry["state"] == "0.0:5"


def test_a_new_save_starts_the_restarts_again_and_a_runs_own_failure_does_not_resume() -> None:
    h = Harness()
    job = running_master(h, 2, wrapper=True, checkpointable=True, max_restarts=1)
    h.report(job, [0], S.RUNNING, state=STATE)
    _again(h, job, h.report(job, [0], S.FAILED, log=log("1000 START 1")), 0)
    h.report(job, [0], S.RUNNING, state={**STATE, "seq": 6, "label": "0.0:6"})
    step = h.report(job, [0], S.FAILED, log=log("1000 START 1"))
    assert h.sm.info((job, 0))["checkpoint"]["restarts"] == 1 and h.sm.info((job, 0))["checkpoint"]["restart_seq"] == 6
    assert only(step, SendSubmit)
    h.report(job, [1], S.RUNNING, state={**STATE, "label": "0.1:5"})
    h.report(job, [1], S.FAILED, exit_code=3, log=log("1000 START 1", "1001 EXIT 3", "1001 END 3"))
    assert h.status(job, 1) == S.FAILED and "resumed" not in h.sm.info((job, 1))["reason"]
    assert h.sm.info((job, 1))["history"][-1]["action"] == "failed"


def _ruled(*rules: Rule) -> tuple[Harness, int]:
    h = Harness()
    return h, running_master(h, 2, wrapper=True, actions=rules)


OOM = log("1000 START 1", "1001 EXIT 137", "1001 END 137")


def test_an_action_rule_retries_on_its_own_budget_and_changes_the_settings() -> None:
    h, job = _ruled(Rule(1, "oom", "more_memory", exit_codes=(137, 137), factor=2.0, cap="8G", max=2))
    for used in (1, 2):
        step = h.report(job, [1], S.FAILED, exit_code=137, log=OOM)
        adjust = only(step, AdjustRun)
        assert (adjust.rule, adjust.setting, adjust.factor, adjust.cap) == ("oom", "mem", 2.0, "8G")
        assert list(adjust.runs) == [(job, 1)]
        info = h.sm.info((job, 1))
        entry = info["history"][-1]
        assert entry["rule"] == "oom" and entry["change"] == "mem x2 (at most 8G)" and entry["action"] == "retry"
        assert "limit" not in entry and info["counters"] == {"rule:oom": used}  # the user's counters untouched
        assert info["reason"].endswith("; retried by rule oom (mem x2 (at most 8G))")
        _again(h, job, step, 1)
    step = h.report(job, [1], S.FAILED, exit_code=137, log=OOM)
    info = h.sm.info((job, 1))
    assert h.status(job, 1) == S.FAILED and not [i for i in step.instructions if isinstance(i, AdjustRun)]
    assert info["reason"].endswith("; rule oom retried it 2 time(s): its max=2 reached")
    assert info["history"][-1]["limit"] == "rule:oom" and info["history"][-1]["action"] == "failed"
    assert info["counters"] == {"rule:oom": 2}


def test_an_action_rule_may_hold_fail_or_retry_as_it_was() -> None:
    h, job = _ruled(Rule(1, "stop", "hold", exit_codes=(1, 1)), Rule(2, "give-up", "fail", exit_codes=(2, 2)),
                    Rule(3, "again", "retry", exit_codes=(3, 3), max=1))
    h.report(job, [0], S.FAILED, exit_code=1, log=log("1000 START 1", "1001 EXIT 1", "1001 END 1"))
    info = h.sm.info((job, 0))
    assert h.status(job, 0) == S.HELD and info["reason"].endswith("; held by rule stop")
    assert info["history"][-1]["action"] == "held" and info["history"][-1]["change"] == "hold"
    h.report(job, [1], S.FAILED, exit_code=2, log=log("1000 START 1", "1001 EXIT 2", "1001 END 2"))
    info = h.sm.info((job, 1))
    assert h.status(job, 1) == S.FAILED and info["reason"].endswith("; failed by rule give-up")
    assert info["history"][-1]["action"] == "failed"
    h2, job2 = _ruled(Rule(3, "again", "retry", exit_codes=(3, 3), max=1))
    step = h2.report(job2, [0], S.FAILED, exit_code=3, log=log("1000 START 1", "1001 EXIT 3", "1001 END 3"))
    assert only(step, SendSubmit) and not [i for i in step.instructions if isinstance(i, AdjustRun)]
    assert h2.sm.info((job2, 0))["reason"].endswith("; retried by rule again (retry)")


def test_a_rule_on_a_checkpointed_run_resumes_it_from_its_state() -> None:
    h = Harness()
    job = running_master(h, 1, wrapper=True, checkpointable=True, actions=(Rule(1, "r", "retry", max=5),))
    h.report(job, [0], S.RUNNING, state=STATE)
    step = h.report(job, [0], S.FAILED, log=log("1000 START 1"))  # the worker died
    entry = h.sm.info((job, 0))["history"][-1]
    assert entry["action"] == "retry" and entry["rule"] == "r" and entry["state"] == "0.0:5" and entry["restart"] == 1
    assert only(step, SendSubmit).start == "resume"


def test_without_log_times_the_run_time_counts_from_running_else_from_submitted() -> None:
    h = Harness()
    job = h.add(profile(limits=limits(early_seconds=60)))
    h.submit_all(job, 2)
    h.tick(50)
    h.report(job, [0], S.RUNNING)
    h.tick(50)  # 50 s since it ran, 100 s since it was submitted
    h.report(job, [0, 1], S.FAILED, exit_code=3)
    assert h.sm.info((job, 0))["history"][-1]["verdict"] == "early"
    assert h.sm.info((job, 1))["history"][-1]["verdict"] == "late_unhandled"  # never seen running


def test_a_rule_resumes_a_run_that_saved_a_state_and_a_held_one_is_not_sent_again() -> None:
    h, job = _ruled(Rule(1, "r", "retry", max=5), )
    h.report(job, [0], S.RUNNING, state={"seq": 3})  # not a job with steps, but it saved a state (no label)
    step = h.report(job, [0], S.FAILED, log=log("1000 START 1"))
    entry = h.sm.info((job, 0))["history"][-1]
    assert entry["state"] == "?:3" and entry["restart"] == 1 and only(step, SendSubmit).start == "resume"
    h2, job2 = _ruled(Rule(1, "stop", "hold"))
    step = h2.report(job2, [0], S.FAILED, log=log("1000 START 1"))
    assert h2.status(job2, 0) == S.HELD and not [i for i in step.instructions if isinstance(i, SendSubmit)]
