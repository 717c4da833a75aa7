"""GBS fault tolerance on real scripted applications (local backend): every row of the table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator import ArgSplitter, Backend, Executable, Job, JobError, Orchestrator, RetryPolicy
from orchestrator.plugin.wrapper import pid_alive


def sim_faults(home: Path, **faults: str) -> None:
    """Switch the sim backend's faults (its documented ``faults.json``); none given switches them off."""
    path = home / "backends" / "sim" / "faults.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(faults))

pytestmark = pytest.mark.anyio
FAST = {"core": {"poll_interval": 0.05}}
#: For a run that kills its own parent (``kill -KILL $PPID``): under the launcher, that is the launcher, and a kill
#: that comes before the launcher told the run's start is judged after ``start_timeout`` (docs/reference.md, "local").
KILLS_PARENT = {**FAST, "backends": {"local": {"start_timeout": 2.0}}}
#: Its wrapper (or launcher) killed once the run's log says it started: under the launcher the program runs a moment
#: before its log says so, and a launcher killed in that moment fails the run at the batch level, not the worker's.
KILL_WRAPPER = 'while ! grep -q START "$ORCH_JOBLOG"; do sleep 0.01; done; kill -KILL $PPID'


def sh(script: str, **kw: Any) -> Job:
    kw.setdefault("backend", "local")
    return Job(application=Executable("/bin/sh", args=["-c", script]), **kw)


def last(job: Job) -> dict[str, Any]:
    return job.info.history[-1]


async def run(orch: Orchestrator, job: Job, timeout: float = 30) -> Job:
    job = await orch.jobs.add(job)
    await job.submit()
    await job.wait(timeout=timeout)
    return job


async def test_retry_twice_then_succeeded(tmp_path: Path) -> None:
    script = ('echo "$ORCH_RETRY_COUNT ${ORCH_RETRY_ARG_1:-none}" >> ../../../seen; '
              'if [ "$ORCH_RETRY_COUNT" -lt 2 ]; then $ORCH_LOG RETRY "$((ORCH_RETRY_COUNT + 7))"; '
              'else echo data > out.txt; $ORCH_LOG RETURN_FILE out.txt; $ORCH_LOG SUCCEEDED out.txt; fi')
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh(script, retry=RetryPolicy(max_early=5)))
        assert j.status == "completed" and j.info.submit_counter == 3
        assert j.info.outputs == ["out.txt"] and (j.outputdir / "out.txt").read_text() == "data\n"
        assert [h["verdict"] for h in j.info.history] == ["early", "early"]
        assert [h["level"] for h in j.info.history] == ["user", "user"]
        assert j.info.counters == {"early": 2}
    assert (tmp_path / "seen").read_text().split("\n") == ["0 none", "1 7", "2 8", ""]


async def test_failed_keyword_fails_without_retry(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh('$ORCH_LOG FAILED bad input file', retry=RetryPolicy(max_early=5)))
        assert j.status == "failed" and j.info.submit_counter == 1
        assert j.info.reason == "FAILED bad input file" and last(j)["level"] == "user"


async def test_hold_then_release_with_new_args(tmp_path: Path) -> None:
    script = 'if [ -z "$ORCH_RETRY_ARG_1" ]; then $ORCH_LOG HOLD need a human; else echo "$ORCH_RETRY_ARG_1"; fi'
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh(script, splitter=ArgSplitter([["-c", script]] * 3)))
        assert [s.status.value for s in j.subjobs] == ["held"] * 3
        assert j.status == "held"  # rule 3
        with pytest.raises(JobError, match="only held"):
            await (await orch.jobs.add(sh("true"))).release()
        await j.subjobs[0].release(retry_args=["go"])
        await j.wait(timeout=30)
        assert j.subjobs[0].status == "completed" and j.status == "held"
        await j.release(retry_args=["on"])
        await j.wait(timeout=30)
        assert j.status == "completed"
        assert [(s.outputdir / "stdout").read_text() for s in j.subjobs] == ["go\n", "on\n", "on\n"]


async def test_release_without_args_gives_the_holds_data_back_as_retry_args(tmp_path: Path) -> None:
    """GBS: a HOLD's data comes back as the retry arguments unless release gives new ones; the hold is
    counted (early here) like a RETRY, and the history reads that verdict."""
    script = ('if [ -z "${ORCH_RETRY_ARG_1:-}" ]; then $ORCH_LOG HOLD 5 x; '
              'else echo "$ORCH_RETRY_ARG_1 ${ORCH_RETRY_ARG_2:-}"; fi')
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh(script))
        assert j.status == "held"
        assert j.info.counters == {"early": 1}
        assert last(j)["verdict"] == "early" and last(j)["action"] == "held"
        await j.release()
        await j.wait(timeout=30)
        assert j.status == "completed", j.info.reason
        assert (j.outputdir / "stdout").read_text() == "5 x\n"


async def test_a_held_jobs_history_does_not_grow_on_reopen_or_ticks(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh("$ORCH_LOG HOLD wait"))
        assert j.status == "held" and len(j.info.history) == 1
        await anyio.sleep(0.5)  # ten monitoring ticks
        assert len(j.info.history) == 1
    for _ in range(3):
        with capture_logs() as logs:
            async with Orchestrator(home=tmp_path, config=FAST) as orch:
                j = orch.jobs[0]
                await anyio.sleep(0.3)
                assert j.status == "held" and len(j.info.history) == 1, j.info.history
        assert not [e for e in logs if "refused" in str(e.get("event", "")) or "illegal" in str(e)], logs


@pytest.mark.parametrize(("sleep", "verdict"), [("0", "early"), ("1", "late_unhandled")])
async def test_nonzero_exit_without_keyword_early_and_late(tmp_path: Path, sleep: str, verdict: str) -> None:
    policy = RetryPolicy(max_early=0, max_late_handled=0, max_late_unhandled=0, early_seconds=0.5)
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh(f"sleep {sleep}; exit 4", retry=policy))
        assert j.status == "failed" and last(j)["level"] == "application" and last(j)["verdict"] == verdict
        assert last(j)["exit_code"] == 4


async def test_a_failures_reason_quotes_the_end_of_stderr(tmp_path: Path) -> None:
    """A relative executable that is not found: the reason says so, in the shell's own words."""
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, Job(application=Executable("no-such-program-here"), backend="local",
                                retry=RetryPolicy(max_early=0)))
        assert j.status == "failed" and last(j)["exit_code"] == 127
        assert "no-such-program-here" in (j.info.reason or "") and "not found" in (j.info.reason or "")
        assert "stderr: " in last(j)["reason"]


async def test_application_killed_by_a_signal(tmp_path: Path) -> None:
    """A program that crashes (SIGSEGV): the application level, with 128 + N. (SIGKILL and SIGTERM are taken as a
    stop of the run's process group from outside, as they stop its wrapper: docs/reference.md, "local".)"""
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh("kill -SEGV $$", retry=RetryPolicy(max_early=1)))
        assert j.status == "failed" and j.info.submit_counter == 2
        assert last(j)["level"] == "application" and last(j)["exit_code"] == 139
        assert "max_early" in last(j)["limit"]


async def test_wrapper_killed_mid_run_is_worker_level(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path, config=KILLS_PARENT) as orch:
        j = await run(orch, sh(f"{KILL_WRAPPER}; sleep 5"))
        assert j.status == "failed" and last(j)["level"] == "worker" and last(j)["verdict"] == "early"


#: The first ``$1`` runs of the job kill their own wrapper (a worker-level fault), then it exits ``$2``, then 0.
CRASHES = ('n=$(cat "../../../count-$ORCH_FQID" 2>/dev/null || echo 0); echo $((n + 1)) > "../../../count-$ORCH_FQID"; '
           f'if [ "$n" -lt "$1" ]; then {KILL_WRAPPER}; sleep 1; fi; if [ "$n" = "$1" ]; then exit "$2"; fi')


def crashes(times: int, then: int = 0, **kw: Any) -> Job:
    return Job(application=Executable("/bin/sh", args=["-c", CRASHES, "sh", str(times), str(then)]), backend="local",
               **kw)


async def test_worker_faults_are_retried_within_their_own_budget_never_the_users(tmp_path: Path) -> None:
    """No action rule matches a local worker that died: its retries count under infrastructure:early, bounded by
    the home's max_infrastructure, while the user's three limits are all zero and stay untouched."""
    config = {**KILLS_PARENT, "retry": {"max_infrastructure": 2}}
    zero = RetryPolicy(max_early=0, max_late_handled=0, max_late_unhandled=0)
    async with Orchestrator(home=tmp_path, config=config) as orch:
        j = await run(orch, crashes(2, retry=zero))
        assert j.status == "completed" and j.info.submit_counter == 3, j.info.history
        assert [(h["level"], h["verdict"], h["action"]) for h in j.info.history] == [("worker", "early", "retry")] * 2
        assert j.info.counters == {"infrastructure:early": 2}

        none = await run(orch, crashes(1, retry=RetryPolicy(max_infrastructure=0, max_early=3)))
        assert none.status == "failed" and last(none)["limit"] == "max_infrastructure"
        assert none.info.counters == {"infrastructure:early": 1}


async def test_an_infrastructure_fault_leaves_the_application_its_whole_max_early(tmp_path: Path) -> None:
    """max_infrastructure unset (the default): the worker's crash is bounded by max_early=1 but counted apart,
    so the application's own early failure after it is still retried once."""
    async with Orchestrator(home=tmp_path, config=KILLS_PARENT) as orch:
        j = await run(orch, crashes(1, then=3, retry=RetryPolicy(max_early=1, max_late_unhandled=0)))
        assert j.status == "completed" and j.info.submit_counter == 3, j.info.history
        assert [(h["level"], h["verdict"]) for h in j.info.history] == [("worker", "early"), ("application", "early")]
        assert j.info.counters == {"infrastructure:early": 1, "early": 1}


async def test_wrapper_never_started_is_batch_level(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh("true", backend=Backend("local", shell="/no/such/sh"),
                               retry=RetryPolicy(max_early=2)))
        assert j.status == "failed" and j.info.submit_counter == 3
        assert [h["level"] for h in j.info.history] == ["batch"] * 3 and last(j)["limit"] == "max_early"


async def test_two_terminal_keywords_are_an_application_failure(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh("$ORCH_LOG SUCCEEDED a; $ORCH_LOG FAILED b"))
        assert j.status == "failed" and last(j)["level"] == "application"
        assert "more than one terminal keyword" in last(j)["reason"]
        e = await run(orch, sh("$ORCH_LOG SUCCEEDED"))
        assert e.status == "failed" and "SUCCEEDED needs data" in last(e)["reason"]  # refused when called


async def test_retry_args_round_trip_and_reuse_below_user_level(tmp_path: Path) -> None:
    script = ('echo "$ORCH_RETRY_COUNT ${ORCH_RETRY_ARG_1:-none}" >> ../../../seen; '
              'case "$ORCH_RETRY_COUNT" in 0) $ORCH_LOG RETRY 3 ;; 1) exit 1 ;; *) exit 0 ;; esac')
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh(script, retry=RetryPolicy(max_early=3)))
        assert j.status == "completed"
    assert (tmp_path / "seen").read_text().split("\n") == ["0 none", "1 3", "2 3", ""]


@pytest.mark.parametrize(("script", "early", "limit"), [
    ("exit 1", 60.0, "max_early"),
    ("$ORCH_LOG RETRY again", 0.0, "max_late_handled"),
    ("exit 1", 0.0, "max_late_unhandled"),
])
async def test_each_limit_on_its_own(tmp_path: Path, script: str, early: float, limit: str) -> None:
    limits = {"max_early": 5, "max_late_handled": 5, "max_late_unhandled": 5, limit: 1}
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh(script, retry=RetryPolicy(early_seconds=early, **limits)))
        assert j.status == "failed" and j.info.submit_counter == 2
        assert last(j)["limit"] == limit and limit in (j.info.reason or "")


async def test_return_file_outside_the_job_dir_is_refused(tmp_path: Path) -> None:
    script = ('echo x > ../escape; echo y > /tmp/orch-abs-$$; ln -s /etc/hostname link; echo ok > good; '
              '$ORCH_LOG RETURN_FILE ../escape; $ORCH_LOG RETURN_FILE /tmp/orch-abs-$$; '
              '$ORCH_LOG RETURN_FILE link; $ORCH_LOG RETURN_FILE good; $ORCH_LOG SUCCEEDED good')
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh(script))
        assert j.status == "completed"
        out = j.outputdir
        assert sorted(p.name for p in out.iterdir()) == ["good", "orch.log", "orch.usage", "stderr", "stdout"]
        refused = [h["reason"] for h in j.info.history if h["verdict"] == "refused"]
        assert len(refused) == 3 and any("../escape" in r for r in refused)
        assert not (out.parent / "escape").exists() or (out.parent / "escape").read_text() == "x\n"


async def test_a_refused_files_record_keeps_a_paths_length(tmp_path: Path) -> None:
    """Each refused RETURN_FILE went into the run's history, its data up to 16 KiB: a hundred made a record of
    1.6 MB. Each goes to a path's length (4,096 characters)."""
    long = "x" * 5_000
    script = (f'i=0; while [ $i -lt 20 ]; do $ORCH_LOG RETURN_FILE ../{long}$i; i=$((i+1)); done; '
              'echo ok > good; $ORCH_LOG SUCCEEDED good')
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh(script))
        assert j.status == "completed", j.info.reason
        refused = [h["reason"] for h in j.info.history if h["verdict"] == "refused"]
        assert len(refused) == 20 and all(len(r) == len("RETURN_FILE ") + 4096 for r in refused), \
            [len(r) for r in refused]


async def test_return_file_through_a_symlinked_directory_is_refused(tmp_path: Path) -> None:
    """A link to a directory outside, then a name through it: refused, and the file outside stays put."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "key.txt").write_text("secret\n")
    script = (f'ln -s {outside} linked; echo ok > good; $ORCH_LOG RETURN_FILE linked/key.txt; '
              '$ORCH_LOG SUCCEEDED good')
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        j = await run(orch, sh(script, outputfiles=["linked/key.txt"]))
        assert j.status == "completed", j.info.reason
        assert (outside / "key.txt").read_text() == "secret\n"  # nothing outside is touched
        assert not (j.outputdir / "key.txt").exists()
        refused = [h["reason"] for h in j.info.history if h["verdict"] == "refused"]
        assert any("linked/key.txt" in r for r in refused), j.info.history
        assert "REFUSED linked/key.txt" in (j.outputdir / "orch.log").read_text()


async def test_late_lines_of_an_earlier_attempt_stay_in_its_own_log(tmp_path: Path) -> None:
    """The first attempt leaves a process behind that writes FAILED into its log 2 s later, while the
    retry runs: the line lands in the first attempt's own file, and the retry's own outcome decides."""
    script = ('if [ "$ORCH_RETRY_COUNT" = 0 ]; then (sleep 2; $ORCH_LOG FAILED late) >/dev/null 2>&1 & '
              '$ORCH_LOG RETRY first; else sleep 3; echo ok > good; $ORCH_LOG SUCCEEDED good; fi')
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh(script, retry=RetryPolicy(early_seconds=0.0, max_late_handled=3)))
        assert j.status == "completed", j.info.reason
        assert j.info.submit_counter == 2
        log = (j.outputdir / "orch.log").read_text()
        assert "SUCCEEDED good" in log and "late" not in log
        assert "FAILED late" in (j.outputdir / "orch.1.log").read_text()  # the first attempt's own file


async def test_a_terminal_keyword_without_data_is_refused_when_called(tmp_path: Path) -> None:
    script = '$ORCH_LOG SUCCEEDED; echo "rc=$?"; $ORCH_LOG FAILED "   "; echo "rc=$?"'
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await run(orch, sh(script))
        assert (j.outputdir / "stdout").read_text() == "rc=2\nrc=2\n"
        assert "$ORCH_LOG SUCCEEDED needs data" in (j.outputdir / "stderr").read_text()
        log = (j.outputdir / "orch.log").read_text()
        assert "SUCCEEDED" not in log and "FAILED" not in log  # nothing was logged
        assert j.status == "completed", j.info.reason  # exit 0 without a keyword


async def test_reopen_in_the_middle_of_a_retry_sequence(tmp_path: Path) -> None:
    script = ('sleep 0.5; echo "$ORCH_RETRY_COUNT ${ORCH_RETRY_ARG_1:-none}" >> ../../../seen; '
              'if [ "$ORCH_RETRY_COUNT" -lt 3 ]; then $ORCH_LOG RETRY "a$ORCH_RETRY_COUNT"; else exit 0; fi')
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(sh(script, retry=RetryPolicy(max_early=5)))
        await j.submit()
        with anyio.fail_after(30):
            while j.info.submit_counter < 2:
                await anyio.sleep(0.05)
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = orch.jobs[0]
        assert j.info.counters["early"] >= 1 and j.info.retry_args
        await j.wait(timeout=30)
        assert j.status == "completed" and j.info.submit_counter == 4 and j.info.counters == {"early": 3}
    assert (tmp_path / "seen").read_text().split("\n") == ["0 none", "1 a0", "2 a1", "3 a2", ""]


async def test_a_driver_that_raises_or_babbles_for_a_while_fails_nothing(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/true"), splitter=ArgSplitter([["a"], ["b"]]),
                                    backend=Backend("sim", run_seconds=0.5, polled=True)))
        sim_faults(tmp_path, status="alternate")  # one query raises, the next babbles, and so on
        await j.submit()
        await anyio.sleep(1.5)
        calls = (await orch.metrics())["backends"]["sim"]["driver"]["calls"]
        assert [s.status.value for s in j.subjobs] == ["submitted", "submitted"] and calls["status_bulk"] >= 2
        sim_faults(tmp_path)
        await j.wait(timeout=30)
        assert j.status == "completed" and all(s.info.history == [] for s in j.subjobs)


async def test_a_silent_backend_leads_to_a_late_unhandled_retry(tmp_path: Path) -> None:
    config = {"core": {"poll_interval": 0.05, "lost_after_seconds": 0.5}}
    async with Orchestrator(home=tmp_path, config=config) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/true"),
                                    backend=Backend("sim", run_seconds=30, polled=True),
                                    retry=RetryPolicy(max_late_unhandled=1)))
        await j.submit()
        sim_faults(tmp_path, status="raise")  # the backend stops answering
        with anyio.fail_after(20):
            while j.info.submit_counter < 2:
                await anyio.sleep(0.05)
        assert j.info.history[0]["level"] == "orchestrator" and j.info.history[0]["verdict"] == "late_unhandled"
        sim_faults(tmp_path)
        await j.kill()


async def test_a_lost_run_that_still_lives_is_killed_and_its_late_lines_spoil_no_retry(tmp_path: Path,
                                                                                      test_drivers: None) -> None:
    """Issue 12, item 2, end to end on a real process: the ``limbo`` backend (``local`` whose answers on a
    first attempt are nonsense) lets the runtime declare attempt 1 lost while its process lives. The
    process is killed after the verdict; what it writes on its way down (a FAILED) lands in its own
    ``orch.1.log``; the retry ends on its own outcome."""
    marks = tmp_path / "marks"
    marks.mkdir()
    script = (f'if [ "$ORCH_ATTEMPT" = 1 ]; then echo $$ > {marks}/pid1; '
              f'trap \'for i in $(seq 160); do [ -e {marks}/second ] && break; sleep 0.05; done; '
              f'$ORCH_LOG FAILED "late word of attempt 1"; touch {marks}/late; exit 1\' TERM; '
              f'sleep 60 & wait; '
              f'else touch {marks}/second; sleep 1; exit 0; fi')
    config = {"core": {"poll_interval": 0.05, "lost_after_seconds": 0.5}, "backends": {"limbo": {"kill_grace": 10}}}
    async with Orchestrator(home=tmp_path / "home", config=config) as orch:
        j = await orch.jobs.add(sh(script, backend="limbo", retry=RetryPolicy(max_late_unhandled=1)))
        await j.submit()
        await j.wait(timeout=30)
        assert j.status == "completed" and j.info.submit_counter == 2
        [entry] = j.info.history
        assert (entry["level"], entry["verdict"], entry["attempt"]) == ("orchestrator", "late_unhandled", 1)
        outputdir = j.outputdir
    pid = int((marks / "pid1").read_text())
    assert (marks / "late").exists(), "attempt 1 was not stopped: it would have slept for a minute"
    with anyio.fail_after(10):  # it ends right after its last word
        while pid_alive(pid):
            await anyio.sleep(0.05)
    late = (outputdir / "orch.1.log").read_text()
    assert "FAILED late word of attempt 1" in late
    own = (outputdir / "orch.log").read_text()  # attempt 2's, renamed once read
    assert "FAILED" not in own and " EXIT 0" in own
