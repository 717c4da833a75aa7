"""What backends say about runs, and what a restart finds: judged here, never in a driver.

- A report of the status a run already has is no news (nothing changes,
  nothing is recorded: a held run reported held each tick stays one entry).
- A run that moves on (running, completing) moves where the table allows;
  a report the table forbids is recorded on the run, never applied.
- A run that ended (completed, failed, held, killed, or a backend verdict)
  is judged (:mod:`.retry`): it completes, fails, is held, or is failed and
  submitted again at once within its limits.
- A run monitoring has heard nothing intelligible of (``RunsSilent``) for
  ``lost_after_seconds`` is lost: judged as an orchestrator-level failure
  (late unhandled: retried by its limits, not failed outright) and killed
  where it can still be reached, so a late line from it never mixes with its
  retry. Silence about an attempt that is no longer the run's, or about a
  run no longer on its way, is no news.
- After a restart (``Started``), runs a crash caught between ``submitting``
  and ``submitted`` are looked up by key where the driver can, sent again
  when the backend never got them, and otherwise left ``new`` with a reason
  (an automatic retry caught midway is carried on: its earlier attempt had
  ended). Postprocessing that fell due while no orchestrator ran is started.
"""

from __future__ import annotations

from .actions import SETTING, Rule
from .base import Core, positions
from .events import RetryDue, RunLost, RunReport, RunsSilent, Started, StatusReport
from .instructions import AdjustRun, Lookup, RunPostprocess
from .jobs import JobState
from .partition import settle
from .retry import judge
from .sending import attempts_of, send_kill, send_submit
from .statuses import ON_THE_WAY, JobStatus

_ON_THE_WAY_CODES = frozenset(s.code for s in ON_THE_WAY)


def handle_status_report(core: Core, event: StatusReport) -> None:
    for report in event.reports:
        js = core.jobs.get(report.runs.job)
        if js is None:
            core.refuse((report.runs.job,), "report for an unknown job", event.stimulus_id)
            continue
        apply_report(core, js, report, event.stimulus_id)


def apply_report(core: Core, js: JobState, report: RunReport, sid: str) -> None:
    idx = positions(js, report.runs)
    if len(js.runs) and max(idx, default=0) >= len(js.runs):
        core.refuse((js.id,), "report for runs the job does not have", sid)
        return
    status = report.status
    if report.state and status in ON_THE_WAY:  # a state saved while the run goes on
        for i in idx:
            js.runs.save_state(i, report.state)
        core.mark(js.id, idx)
    if status in ON_THE_WAY and report.verdict is None:
        news = [i for i in idx if js.runs.status[i] != status.code]
        moved = core.move(js, news, status, sid, report=True)
        if status == JobStatus.RUNNING and report.started is not None:
            core.set_run_times(js, moved, started=report.started, ended=None)
        settle(core, js, sid)
        return
    runs = js.runs
    ending = [i for i in idx if runs.status[i] in _ON_THE_WAY_CODES]
    if not ending:
        return
    if status == JobStatus.COMPLETED and report.verdict is None and not js.profile.wrapper:
        for i in ending:  # the backend's word is final (no wrapper log to read): a clean ending
            if (extra := runs.extras.get(i)) is not None:
                extra.reason = None
        moved = core.move(js, ending, JobStatus.COMPLETED, sid, report=True)
        core.set_run_times(js, moved, started=report.started, ended=report.ended)
        settle(core, js, sid)
        return
    by_status: dict[JobStatus, list[int]] = {}
    retries: list[int] = []
    adjust: dict[str, tuple[Rule, list[int]]] = {}
    for i in ending:
        verdict = judge(js, i, report, core.now)
        by_status.setdefault(verdict.status, []).append(i)
        if verdict.retry:
            retries.append(i)
            if verdict.adjust is not None:
                adjust.setdefault(verdict.adjust.name, (verdict.adjust, []))[1].append(i)
    started, ended = report_times(report)
    for target in (JobStatus.HELD, JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.KILLED):
        if target in by_status:
            moved = core.move(js, by_status[target], target, sid, report=True)
            core.set_run_times(js, moved, started=started, ended=ended)
    core.mark(js.id, ending)
    for rule, indexes in adjust.values():  # carried out before the retries' submission, in the same step
        core.emit(AdjustRun(stimulus_id=sid, runs=core.runs_of(js, indexes), rule=rule.name,
                            setting=SETTING.get(rule.action), factor=rule.factor, cap=rule.cap, values=rule.settings))
    if retries:
        retry(core, js, retries, sid)
    settle(core, js, sid)


def report_times(report: RunReport) -> tuple[float | None, float | None]:
    """When the run started and ended: the report's own times, else its wrapper log's start and end lines (an
    end only with its start: a log that has an end line has a start line)."""
    started, ended = report.started, report.ended
    log = report.log
    if log is not None and report.verdict is None:
        started = started if started is not None else log.started
        ended = ended if ended is not None else log.ended
    if started is not None and ended is not None and ended < started:
        ended = None  # nonsense: the time it was seen stands
    return started, ended


def retry(core: Core, js: JobState, indexes: list[int], sid: str) -> None:
    """Failed runs the limits allow to run again: submitted again now, from their newest state; and retries the
    backend refused, still ``submitting``, whose pause is over (``RetryDue``)."""
    ready = [i for i in indexes if js.runs.status[i] == JobStatus.FAILED.code]
    waiting = [i for i in indexes if js.runs.status[i] == JobStatus.SUBMITTING.code]
    core.move(js, ready, JobStatus.SUBMITTING, sid)
    send_submit(core, js, sorted(ready + waiting) if waiting else ready, sid, kind="retry", start="resume")


def handle_runs_silent(core: Core, event: RunsSilent) -> None:
    """Silent for ``lost_after`` or longer: the runs still on their way, at the attempt monitoring watched, are
    lost."""
    js = core.jobs.get(event.runs.job)
    if js is None or event.time - event.since < core.lost_after:
        return
    status, attempt = js.runs.status, js.runs.attempt
    idx = [i for i, a in zip(positions(js, event.runs), event.attempts, strict=False)
           if status[i] in _ON_THE_WAY_CODES and attempt[i] == a]
    _lose(core, js, idx, event.reason, event.stimulus_id)


def handle_run_lost(core: Core, event: RunLost) -> None:
    js = core.jobs.get(event.runs.job)
    if js is None:
        return
    idx = [i for i in positions(js, event.runs) if js.runs.status[i] in _ON_THE_WAY_CODES]
    _lose(core, js, idx, event.reason, event.stimulus_id)


def _lose(core: Core, js: JobState, idx: list[int], reason: str, sid: str) -> None:
    if not idx:
        return
    send_kill(core, js, idx, sid, to=None)  # best effort: its late lines must not reach its retry
    apply_report(core, js, RunReport(core.runs_of(js, idx), JobStatus.FAILED, reason=reason, verdict="lost"), sid)


def handle_retry_due(core: Core, event: RetryDue) -> None:
    js = core.jobs.get(event.runs.job)
    if js is not None:
        retry(core, js, list(positions(js, event.runs)), event.stimulus_id)


def handle_started(core: Core, event: Started) -> None:
    sid = event.stimulus_id
    for js in list(core.jobs.values()):
        interrupted = js.runs.indexes_in([JobStatus.SUBMITTING])
        if interrupted:
            _recover(core, js, interrupted, sid)
        if js.is_master and js.profile.postprocess and js.all_final() and js.pinned is None and \
                js.merged_at < max(js.runs.times["final"], default=0.0):
            js.postprocessing = True  # it ended while no orchestrator was there to run them
            core.emit(RunPostprocess(stimulus_id=sid, job=js.id))


def _recover(core: Core, js: JobState, interrupted: list[int], sid: str) -> None:
    if js.profile.lookup:
        runs = core.runs_of(js, interrupted)
        core.emit(Lookup(stimulus_id=sid, backend=js.profile.backend, runs=runs, attempts=attempts_of(js, runs)))
        return
    carry_on = []
    back = []
    for i in interrupted:
        extra = js.runs.extras.get(i)
        if extra is not None and extra.history and extra.history[-1].get("action") == "retry":
            carry_on.append(i)
        else:
            back.append(i)
            js.runs.extra(i).reason = ("submission interrupted by a restart; the backend cannot say whether "
                                       "it got it: check, then resubmit")
    core.move(js, back, JobStatus.NEW, sid)
    send_submit(core, js, carry_on, sid, kind="resend", persist=False)
    settle(core, js, sid)


__all__ = ["handle_retry_due", "handle_run_lost", "handle_runs_silent", "handle_started", "handle_status_report"]
