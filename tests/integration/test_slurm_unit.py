"""The ``slurm`` backend without a cluster: its parsers on Slurm's real output, its settings, and its
decisions (arrays, chunks, state mapping, vanished runs, kills) against a scripted fake of the commands.

The real-cluster tests are in ``tests/integration/test_slurm.py``; these cover what a
one-node test cluster cannot be made to do on demand (a node failure, an
out-of-memory kill, a preemption, a controller that hangs during ``sbatch``).
The last test puts a fake of Slurm's commands on ``PATH`` and runs a job through
the public API: a node failure retried by the default action table.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import anyio
import pytest
from orch_slurm import SlurmDriver
from orch_slurm.settings import resources_key, sbatch_options, validate
from orch_slurm.slurm import (
    JobRef,
    Result,
    SlurmError,
    SlurmTimeout,
    batch_key,
    batch_script,
    parse_job_id,
    parse_max_array_size,
    parse_sacct,
    parse_scancel_errors,
    parse_squeue,
)

from orchestrator import Backend, Executable, Job, JobError, JobStatus, Orchestrator, RetryPolicy
from orchestrator.plugin import DriverContext, RunHandle, RunSpec, SettingsError, SubmitError

S = JobStatus
Answer = Result | Exception


class FakeSlurm:
    """Answers each command by its name from a script of answers (or a function of the argv); records them."""

    def __init__(self, answers: Mapping[str, Answer | Callable[[Sequence[str]], Answer]]) -> None:
        self.answers = dict(answers)
        self.seen: list[tuple[list[str], bytes | None, Mapping[str, str] | None]] = []

    async def __call__(self, argv: Sequence[str], *, stdin: bytes | None, env: Mapping[str, str] | None,
                       timeout: float) -> Result:
        self.seen.append((list(argv), stdin, env))
        answer = self.answers[argv[0]]
        if callable(answer):
            answer = answer(argv)
        if isinstance(answer, Exception):
            raise answer
        return answer


def ok(out: str = "") -> Result:
    return Result(0, out, "")


def driver(tmp_path: Path, fake: FakeSlurm, **config: object) -> SlurmDriver:
    d = SlurmDriver(DriverContext(home=tmp_path, config=dict(config), statedir=tmp_path / "state"))
    (tmp_path / "state").mkdir(exist_ok=True)
    d.runner = fake
    return d


def spec(tmp_path: Path, i: int, **settings: object) -> RunSpec:
    jobdir = tmp_path / "ws" / "1" / str(i)
    return RunSpec(fqid=f"1.{i}", index=i, attempt=1, key=f"orch-k-1.{i}-1", executable="/bin/true", args=(),
                   env={}, settings=settings, inputs=(), outputfiles=(), jobdir=jobdir, inputdir=jobdir / "input",
                   outputdir=jobdir / "output", workdir=jobdir / "work")


def handle(tmp_path: Path, i: int, backend_id: str, status: JobStatus = S.SUBMITTED) -> RunHandle:
    out = tmp_path / "ws" / "1" / str(i) / "output"
    out.mkdir(parents=True, exist_ok=True)
    return RunHandle(fqid=f"1.{i}", index=i, backend_id=backend_id, settings={}, outputdir=out, status=status)


def write_log(h: RunHandle, *lines: str) -> None:
    (h.outputdir / "orch.log").write_text("".join(f"{100 + n}.0 {line}\n" for n, line in enumerate(lines)))


# ----------------------------------------------------------------- parsers
def test_parsers_read_slurm_output() -> None:
    rows = parse_squeue("8|0|9|CANCELLED|None\n8|3|8|PENDING|Resources\n2|N/A|2|COMPLETED|None\ngarbage\n")
    assert set(rows) == {"8_0", "8_3", "2"}
    assert rows["8_0"].state == "CANCELLED" and rows["8_0"].unique == "9"
    assert rows["8_3"].reason == "Resources" and rows["2"].state == "COMPLETED"
    got = parse_sacct("1|COMPLETED|0:0\n7|CANCELLED by 0|0:15\n9|FAILED|3:0\n")
    assert got["7"].state == "CANCELLED" and got["9"].exit_code == 3 and got["1"].exit_code == 0
    assert parse_job_id("123\n") == "123" and parse_job_id("45;cluster\n") == "45"
    with pytest.raises(SlurmError):
        parse_job_id("sbatch: error: nope")
    assert parse_max_array_size("MaxArraySize            = 1001\nMaxJobCount = 10000\n") == 1001
    assert parse_max_array_size("nothing") is None
    errs = parse_scancel_errors("scancel: error: Kill job error on job id 12_3: Job/step already completing or "
                                "completed\nscancel: error: Kill job error on job id 13: Access/permission denied\n")
    assert errs == {"13": "Access/permission denied"}
    assert JobRef.parse("12_3") == JobRef("12", "3") and JobRef.parse("12").key == "12"
    for bad in ("x", "12_", "12_a", ""):
        with pytest.raises(ValueError):
            JobRef.parse(bad)
    assert batch_key(["orch-a-1.0-1"]) == "orch-a-1.0-1"
    assert batch_key(["a", "b"]).startswith("orch-array-") and batch_key(["a", "b"]) != batch_key(["b", "a"])


def test_batch_script_picks_the_run_by_task_id_and_quotes_paths(tmp_path: Path) -> None:
    fake_wrapper = tmp_path / "wrapper.sh"
    fake_wrapper.write_text('echo "wrapped $1"\n')
    dirs = [tmp_path / "run 0", tmp_path / "run 'one' $(touch pwned)"]
    for d in dirs:
        d.mkdir()
    script = batch_script("/bin/sh", fake_wrapper, dirs, "run.env")
    for task in ("0", "1"):
        subprocess.run(["sh", "-c", script], env={"SLURM_ARRAY_TASK_ID": task, "PATH": "/usr/bin:/bin"}, check=True,
                       cwd=tmp_path)
    for d in dirs:
        assert (d / "wrapper.out").read_text() == f"wrapped {d}/run.env\n"
    assert not (tmp_path / "pwned").exists()
    bad = subprocess.run(["sh", "-c", script], env={"SLURM_ARRAY_TASK_ID": "7"}, capture_output=True, text=True)
    assert bad.returncode == 97 and "no run for array task 7" in bad.stderr


# ---------------------------------------------------------------- settings
def test_settings_are_checked_and_become_sbatch_options(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    s = validate({"partition": "debug", "time": 5, "mem": 500, "cpus": 2, "account": "phys", "qos": "low",
                  "sbatch_args": ["--constraint=avx2"], "slurm_conf": str(conf)})
    assert s["time"] == "5" and s["mem"] == "500"
    assert sbatch_options(s) == ["--partition=debug", "--time=5", "--mem=500", "--cpus-per-task=2",
                                 "--account=phys", "--qos=low", "--constraint=avx2"]
    assert resources_key(s) != resources_key({**s, "time": "6"})
    assert validate({"time": "1-12:00:00", "mem": "4G"}) == {"time": "1-12:00:00", "mem": "4G"}
    bad: list[tuple[dict[str, object], str]] = [
        ({"time": "0:05 ; rm -rf /"}, "time"), ({"time": 0}, "time"), ({"mem": "lots"}, "mem"),
        ({"cpus": 0}, "cpus"), ({"cpus": True}, "cpus"), ({"partition": "a b"}, "partition"),
        ({"sbatch_args": ["--array=0-3"]}, "sbatch_args"), ({"sbatch_args": ["-Jx"]}, "sbatch_args"),
        ({"sbatch_args": "--exclusive"}, "sbatch_args"), ({"slurm_conf": "relative.conf"}, "slurm_conf"),
        ({"via": "ssh", "host": "login.example"}, "via"), ({"via": "carrier-pigeon"}, "via"),
        ({"host": "login"}, "host"), ({"nodes": 2}, "nodes"),
    ]
    for settings, field in bad:
        with pytest.raises(SettingsError) as info:
            validate(settings)
        assert info.value.field == field, settings


@pytest.mark.anyio
async def test_via_ssh_is_refused_at_add_naming_the_field(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        with pytest.raises(JobError) as info:
            await orch.jobs.add(Job(application=Executable("/bin/true"),
                                    backend=Backend("slurm", via="ssh", host="login.example")))
        assert "backend.via" in str(info.value) and "not supported yet" in str(info.value)


# ------------------------------------------------------------------ submit
@pytest.mark.anyio
async def test_arrays_are_chunked_under_max_array_size_and_grouped_by_resources(tmp_path: Path) -> None:
    jobs = iter(range(100, 200))
    fake = FakeSlurm({"scontrol": ok("MaxArraySize = 4\n"), "sbatch": lambda argv: ok(f"{next(jobs)}\n")})
    d = driver(tmp_path, fake)
    runs = [spec(tmp_path, i, time="10") for i in range(10)] + [spec(tmp_path, 10 + i, time="20") for i in range(3)]
    outcomes = await d.submit_bulk(runs)
    assert all(o.ok for o in outcomes)
    assert d.calls == {"scontrol": 1, "sbatch": 4}
    arrays = [next(a for a in argv if a.startswith("--array")) for argv, _, _ in fake.seen if argv[0] == "sbatch"]
    assert arrays == ["--array=0-3", "--array=0-3", "--array=0-1", "--array=0-2"]
    assert [o.backend_id for o in outcomes[:5]] == ["100_0", "100_1", "100_2", "100_3", "101_0"]
    assert outcomes[10].backend_id == "103_0"
    first = fake.seen[1]
    assert "--time=10" in first[0] and "--no-requeue" in first[0] and first[1] is not None
    assert str(runs[0].jobdir) in first[1].decode() and "exec /bin/sh" in first[1].decode()
    assert (runs[0].jobdir / "run.env").read_text().count("ORCH_KEY=orch-k-1.0-1") == 1
    await d.submit_bulk([spec(tmp_path, 20)])  # a lone run: a plain job, and MaxArraySize is not asked again
    assert d.calls == {"scontrol": 1, "sbatch": 5} and not any(a.startswith("--array") for a in fake.seen[-1][0])


@pytest.mark.anyio
async def test_a_refused_chunk_fails_its_runs_and_nothing_submitted_raises(tmp_path: Path) -> None:
    answers = iter([ok("7\n"), Result(1, "", "sbatch: error: Batch job submission failed: Invalid partition")])
    fake = FakeSlurm({"scontrol": ok("MaxArraySize = 2\n"), "sbatch": lambda argv: next(answers)})
    d = driver(tmp_path, fake)
    outcomes = await d.submit_bulk([spec(tmp_path, i) for i in range(4)])
    assert [o.ok for o in outcomes] == [True, True, False, False]
    assert "Invalid partition" in (outcomes[2].error or "")
    fake.answers["sbatch"] = Result(1, "", "sbatch: error: Unable to contact slurm controller")
    with pytest.raises(SubmitError, match="Unable to contact"):
        await d.submit_bulk([spec(tmp_path, 9)])


@pytest.mark.anyio
async def test_a_hung_sbatch_is_looked_up_by_its_key_before_it_counts_as_failed(tmp_path: Path) -> None:
    run = spec(tmp_path, 0)
    fake = FakeSlurm({"sbatch": SlurmTimeout("sbatch did not answer within 60 s"),
                      "squeue": ok(f"55|{run.key}\n")})
    d = driver(tmp_path, fake)
    assert await d.submit(run) == "55"  # it went in: accepted, never sent twice
    assert fake.seen[-1][0][:5] == ["squeue", "-h", "--states=all", "-n", run.key]
    fake.answers["squeue"] = ok("")
    with pytest.raises(SubmitError, match="did not answer"):
        await d.submit(spec(tmp_path, 1))


# ------------------------------------------------------------------ status
@pytest.mark.anyio
async def test_states_map_to_statuses_and_verdicts_in_one_squeue(tmp_path: Path) -> None:
    squeue = "\n".join(["5|0|5|PENDING|Priority", "5|1|11|RUNNING|None", "5|2|12|COMPLETED|None",
                        "5|3|13|FAILED|NonZeroExitCode", "5|4|14|TIMEOUT|TimeLimit", "5|5|15|NODE_FAIL|None",
                        "5|6|16|OUT_OF_MEMORY|None", "5|7|17|CANCELLED|None", "5|8|18|CANCELLED|None",
                        "5|9|19|PREEMPTED|None", "5|10|20|SOME_NEW_STATE|None", ""])
    fake = FakeSlurm({"squeue": ok(squeue), "scancel": ok()})
    d = driver(tmp_path, fake)
    hs = [handle(tmp_path, i, f"5_{i}") for i in range(11)]
    write_log(hs[3], "START 1", "EXIT 3", "END 3")
    write_log(hs[4], "START 1")  # over its time limit: the wrapper started, never ended
    assert await d.kill_bulk([hs[8]]) == [None]
    got = {u.fqid: u for u in await d.status_bulk(hs)}
    assert d.calls["squeue"] == 1 and d.tick_calls[-1] == {"squeue": 1}
    assert "1.0" not in got and "1.10" not in got  # pending: unchanged; unknown state: left as it is
    assert got["1.1"].status == S.RUNNING and got["1.2"].status == S.COMPLETED
    assert got["1.3"].status == S.FAILED and got["1.3"].exit_code == 3 and got["1.3"].backend_verdict is None
    assert got["1.4"].status == S.FAILED and got["1.4"].backend_verdict is None and "TIMEOUT" in str(got["1.4"].reason)
    assert got["1.5"].backend_verdict == "aborted" and got["1.6"].backend_verdict == "aborted"
    assert got["1.7"].status == S.HELD and got["1.7"].backend_verdict == "cancelled"  # not cancelled by us
    assert got["1.8"].status == S.KILLED
    assert got["1.9"].status == S.HELD and got["1.9"].backend_verdict == "cancelled"
    running = handle(tmp_path, 1, "5_1", S.RUNNING)
    assert await d.status_bulk([running]) == []  # only changes are reported


@pytest.mark.anyio
async def test_runs_squeue_no_longer_lists_are_looked_up_then_judged_by_their_log(tmp_path: Path) -> None:
    listed = ["6|0|21|RUNNING|None", "6|1|22|RUNNING|None", "6|2|6|PENDING|None", "6|3|6|PENDING|None",
              "6|4|6|PENDING|None", "9|N/A|9|RUNNING|None"]
    fake = FakeSlurm({"squeue": ok("\n".join(listed)),
                      "sacct": ok("21|COMPLETED|0:0\n")})
    d = driver(tmp_path, fake)
    hs = [handle(tmp_path, i, f"6_{i}") for i in range(4)] + [handle(tmp_path, 4, "6_4"), handle(tmp_path, 5, "9")]
    await d.status_bulk(hs)  # learns the running tasks' own job ids
    fake.answers["squeue"] = ok("6|4|6|PENDING|None\n")  # the rest vanished (purged, or cancelled while pending)
    write_log(hs[1], "START 1", "EXIT 0", "END 0")
    first = {u.fqid: u for u in await d.status_bulk(hs)}
    assert set(first) == {"1.1"} and first["1.1"].status == S.COMPLETED  # its log says it ended: no need to wait
    assert d.calls["sacct"] == 0
    second = {u.fqid: u for u in await d.status_bulk(hs)}  # missing twice: looked up, one sacct for all
    assert d.calls["sacct"] == 1 and d.tick_calls[-1] == {"squeue": 1, "sacct": 1}
    assert fake.seen[-1][0][-1] == "9,21"  # task 0's own id, and the plain job
    assert second["1.0"].status == S.COMPLETED  # sacct -c knew it
    assert second["1.2"].status == S.HELD and second["1.2"].backend_verdict == "cancelled"  # siblings still listed
    assert second["1.3"].status == S.HELD
    assert second["1.5"].status == S.FAILED and second["1.5"].backend_verdict == "lost"  # no record, no log
    assert "1.4" not in second


@pytest.mark.anyio
async def test_a_silent_controller_is_the_backends_fault(tmp_path: Path) -> None:
    fake = FakeSlurm({"squeue": Result(1, "", "slurm_load_jobs error: Unable to contact slurm controller")})
    d = driver(tmp_path, fake)
    with pytest.raises(SlurmError, match="Unable to contact"):
        await d.status_bulk([handle(tmp_path, 0, "3_0")])
    fake.answers["squeue"] = Result(1, "", "slurm_load_jobs error: Invalid job id specified")
    assert await d.status_bulk([handle(tmp_path, 0, "3")]) == []  # one unknown id alone: not an outage


# -------------------------------------------------------------------- kill
@pytest.mark.anyio
async def test_kill_is_one_scancel_of_the_tasks_asked(tmp_path: Path) -> None:
    fake = FakeSlurm({"scancel": Result(1, "", "scancel: error: Kill job error on job id 4_2: Access/permission "
                                               "denied\n")})
    d = driver(tmp_path, fake)
    hs = [handle(tmp_path, i, f"4_{i}") for i in range(3)] + [handle(tmp_path, 3, "nonsense")]
    results = await d.kill_bulk(hs)
    assert fake.seen[-1][0] == ["scancel", "4_0", "4_1", "4_2"]
    assert results[:2] == [None, None] and "permission denied" in str(results[2]) and results[3] is not None
    fake.answers["scancel"] = SlurmError("cannot run scancel: not found")
    assert await d.kill_bulk(hs[:1]) == ["cannot run scancel: not found"]
    with anyio.fail_after(1):
        with pytest.raises(SlurmError):
            await d.kill(hs[0])


# ------------------------------------------------- a node failure, end to end through the API
#: Slurm's commands as one script on PATH: ``sbatch`` either loses the job to a node failure before it starts
#: (while the count in ``node_fail`` lasts) or runs the batch script to its end; ``squeue`` and ``sacct`` list
#: every job with its state. Enough of Slurm for the driver, run by the orchestrator as it runs the real ones.
FAKE_COMMANDS = '''
import json, os, subprocess, sys
from pathlib import Path
state = Path(os.environ["FAKE_SLURM_DIR"])
jobs_file = state / "jobs.json"
jobs = json.loads(jobs_file.read_text()) if jobs_file.exists() else {}
command = Path(sys.argv[0]).name
if command == "scontrol":
    print("MaxArraySize = 1001")
elif command == "sbatch":
    job, script = str(100 + len(jobs)), sys.stdin.read()
    failing = int((state / "node_fail").read_text())
    if failing > 0:
        (state / "node_fail").write_text(str(failing - 1))
        jobs[job] = "NODE_FAIL"
    else:
        subprocess.run(["sh", "-c", script], env={**os.environ, "SLURM_ARRAY_TASK_ID": "0"}, check=False)
        jobs[job] = "COMPLETED"
    jobs_file.write_text(json.dumps(jobs))
    print(job)
elif command == "squeue":
    print("\\n".join(f"{job}|N/A|{job}|{st}|None" for job, st in jobs.items()))
elif command == "sacct":
    print("\\n".join(f"{job}|{st}|0:0" for job, st in jobs.items()))
'''


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake commands first on PATH; returns the state dir (write how many sbatch fail in ``node_fail``)."""
    bindir, state = tmp_path / "fake-bin", tmp_path / "fake-slurm"
    bindir.mkdir()
    state.mkdir()
    (state / "node_fail").write_text("0")
    script = bindir / "fake-slurm"
    script.write_text(f"#!{sys.executable}\n{FAKE_COMMANDS}")
    script.chmod(0o755)
    for name in ("sbatch", "squeue", "sacct", "scancel", "scontrol"):
        (bindir / name).symlink_to(script)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_DIR", str(state))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return state


@pytest.mark.anyio
async def test_a_node_failure_is_retried_by_the_default_rule_not_the_users_limits(fake_slurm: Path,
                                                                                   tmp_path: Path) -> None:
    zero = RetryPolicy(max_early=0, max_late_handled=0, max_late_unhandled=0)
    async with Orchestrator(home=tmp_path / "home", config={"core": {"poll_interval": 0.05}}) as orch:
        (fake_slurm / "node_fail").write_text("1")
        once = await orch.jobs.add(Job(name="once", application=Executable("/bin/echo", args=["ran"]),
                                       backend="slurm", retry=zero))
        await once.submit()
        await once.wait(timeout=30)
        assert once.status == "completed" and await once.peek() == "ran\n"
        [entry] = once.info.history
        assert (entry["level"], entry["rule"], entry["action"]) == ("backend", "slurm-node-failure", "retry")
        assert "NODE_FAIL" in entry["reason"] and once.info.counters == {"rule:slurm-node-failure": 1}

        (fake_slurm / "node_fail").write_text("9")  # a node that never comes back: the rule's max=3, then failed
        lost = await orch.jobs.add(Job(name="lost", application=Executable("/bin/true"), backend="slurm", retry=zero))
        await lost.submit()
        await lost.wait(timeout=30)
        assert lost.status == "failed" and lost.info.submit_counter == 4
        assert lost.info.history[-1]["limit"] == "rule:slurm-node-failure"
        assert lost.info.counters == {"rule:slurm-node-failure": 3}
