"""The ``ssh`` backend against real OpenSSH sshds on loopback (see ``tests/support/sshd.py``).

Acceptance tests of issue 4 (SSH half): 1. a 20-subjob job completes with
each subjob's stdout fetched back, spread over two sshds acting as two
hosts; 2. sshd stopped mid-run and started again: nothing fails for it,
everything completes, nothing runs twice; 5. monitoring costs one remote
command per host per tick, whatever the number of subjobs; 6. a mismatched
host key is a clear error, never a silent accept. Plus: adoption of remote
runs by a reopened home, kill of a remote process group, settings errors.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest
from orch_ssh import scripts
from orch_ssh.host import SCRIPT_FILES, SCRIPTS_HASH, Dropped, Host
from orch_ssh.settings import validate
from sshd import SshEnv, write_key
from structlog.testing import capture_logs

from orchestrator import ArgSplitter, Backend, Executable, Job, JobError, Orchestrator

pytestmark = pytest.mark.anyio
FAST = {"core": {"poll_interval": 0.1}}


async def ssh_driver(orch: Orchestrator) -> SimpleNamespace:
    """The ssh driver's metrics (commands and transfers per kind and host, per tick), and the runs it holds."""
    m = (await orch.metrics())["backends"]["ssh"]
    return SimpleNamespace(calls=Counter(m["driver"]["calls"]), ticks=m["driver"]["ticks"],
                           tick_commands=m["driver"]["tick_commands"], tick_runs=m["driver"]["tick_runs"],
                           held=m["held"])


def sh_job(script: str, n: int, backend: Backend, **kw: object) -> Job:
    """``n`` subjobs of ``sh -c script i`` (``$0`` is the index)."""
    return Job(name="ssh", application=Executable("/bin/sh", args=["-c", script, "-"]),
               splitter=ArgSplitter([["-c", script, str(i)] for i in range(n)]), backend=backend, **kw)


def executions(side: Path, n: int) -> dict[int, int]:
    """How many times each index ran, by its side file."""
    out = {}
    for i in range(n):
        f = side / str(i)
        out[i] = len(f.read_text().split()) if f.exists() else 0
    return out


def host_of(backend_id: str | None) -> str:
    assert backend_id is not None
    return backend_id.split("@", 1)[1]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


# --------------------------------------------------------------------------- 1
async def test_twenty_subjobs_spread_over_two_hosts_with_outputs_fetched(ssh_env2: SshEnv, tmp_path: Path) -> None:
    env = ssh_env2
    data = tmp_path / "data.txt"
    data.write_text("shared input\n")
    workdir = env.workdir / "work dir 'quoted' $(x)"  # every remote path goes through shlex.quote
    script = 'echo "out $0 $(id -un)"; cat data.txt > result.txt; echo "$0" >> result.txt'
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        j = await orch.jobs.add(sh_job(script, 20, Backend("ssh", **env.settings(workdir=str(workdir))),
                                       inputfiles=[str(data)], outputfiles=["result.txt"]))
        await j.submit()
        await j.wait(timeout=60)
        assert j.status == "completed", [(s.fqid, s.status.value, s.info.reason) for s in j.subjobs]
        driver = await ssh_driver(orch)
        for i, sub in enumerate(j.subjobs):
            assert sub.status == "completed"
            assert (sub.outputdir / "stdout").read_text() == f"out {i} {env.user}\n"  # ran remotely, fetched back
            assert (sub.outputdir / "result.txt").read_text() == f"shared input\n{i}\n"
            assert "END 0" in (sub.outputdir / "orch.log").read_text()
        per_host = {h: sum(1 for s in j.subjobs if host_of(s.backend_id) == h) for h in env.hosts}
        assert per_host == {env.hosts[0]: 10, env.hosts[1]: 10}  # spread by free slots, never all to one
        for h in env.hosts:
            assert driver.calls[f"submit:{h}"] == 1  # one remote command per host started its runs
            assert driver.calls[f"sftp_stage:{h}"] == 1  # the shared input, staged once per host
        assert driver.calls["sftp_get"] == 20  # each run's output dir fetched once
    namespace = (tmp_path / "home" / "backends" / "ssh" / "namespace").read_text().strip()
    assert len(list((workdir / namespace / "runs").iterdir())) == 20


# --------------------------------------------------------------------------- 2
async def test_sshd_stopped_mid_run_nothing_fails_or_runs_twice(ssh_env: SshEnv, side: Path, tmp_path: Path) -> None:
    env = ssh_env
    n = 20
    script = f'echo "$$" >> {side}/"$0"; sleep 1.5; echo "done $0"'
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(sh_job(script, n, Backend("ssh", **env.settings(slots=8))))
        await j.submit()
        with anyio.fail_after(20):  # some are running, the rest wait for slots
            while sum(executions(side, n).values()) < 4:
                await anyio.sleep(0.05)
        env.sshds[0].stop()
        await anyio.sleep(3)  # runs end while their host is unreachable; queued ones cannot start
        assert j.status in ("submitted", "running")
        env.sshds[0].start()
        await j.wait(timeout=60)
        driver = await ssh_driver(orch)
        assert j.status == "completed", [(s.fqid, s.status.value, s.info.reason) for s in j.subjobs]
        assert all(s.info.history == [] and s.info.submit_counter == 1 for s in j.subjobs)  # no failure, no retry
        assert executions(side, n) == {i: 1 for i in range(n)}  # none ran twice, none was skipped
        assert all((s.outputdir / "stdout").read_text() == f"done {i}\n" for i, s in enumerate(j.subjobs))
        assert driver.calls["connect"] >= 2  # the outage was real: it reconnected


async def test_reopened_home_adopts_remote_runs(ssh_env: SshEnv, side: Path, tmp_path: Path) -> None:
    """Runs outlive the orchestrator; a reopened home finds running, ended and still-queued runs."""
    env = ssh_env
    n = 10
    script = f'echo "$$" >> {side}/"$0"; sleep 1; echo "done $0"'
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(sh_job(script, n, Backend("ssh", **env.settings(slots=4))))
        await j.submit()
        with anyio.fail_after(20):
            while sum(executions(side, n).values()) < 4:
                await anyio.sleep(0.05)
        job_id = j.id
    await anyio.sleep(1.5)  # the first four end while no orchestrator is there
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = orch.jobs(job_id)
        await j.wait(timeout=60)
        assert j.status == "completed", [(s.fqid, s.status.value, s.info.reason) for s in j.subjobs]
        assert all((s.outputdir / "stdout").read_text() == f"done {i}\n" for i, s in enumerate(j.subjobs))
    assert executions(side, n) == {i: 1 for i in range(n)}


# --------------------------------------------------------------------------- 5
async def test_one_monitor_command_per_host_per_tick(ssh_env2: SshEnv, tmp_path: Path) -> None:
    env = ssh_env2
    n = 40
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(sh_job("sleep 1.5", n, Backend("ssh", **env.settings(slots=20))))
        await j.submit()
        await j.wait(timeout=60)
        assert j.status == "completed"
        driver = await ssh_driver(orch)
        ticks = list(driver.tick_commands)
        runs = list(driver.tick_runs)
        assert len(ticks) == driver.ticks >= 5
        # Every tick: exactly one remote command on each host that had runs, however many runs it had.
        assert all(tick == {h: 1 for h in looked} for tick, looked in zip(ticks, runs, strict=True))
        assert max(r.get(h, 0) for r in runs for h in env.hosts) == 20  # 20 runs a host, still one command
        assert driver.calls["monitor"] == sum(len(t) for t in ticks)
        for h in env.hosts:
            assert driver.calls[f"monitor:{h}"] <= driver.ticks
            assert driver.calls[f"monitor:{h}"] == sum(t.get(h, 0) for t in ticks)
        assert driver.held == 0  # all over: the driver holds no run, every slot is free again


# --------------------------------------------------------------------------- 6
async def test_mismatched_host_key_is_a_clear_error(ssh_env: SshEnv, tmp_path: Path) -> None:
    env = ssh_env
    impostor = write_key(tmp_path / "impostor")
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{env.sshds[0].port} {impostor.export_public_key().decode()}")
    async with Orchestrator(home=tmp_path / "home", config=FAST) as orch:
        with capture_logs() as logs:
            j = await orch.jobs.add(sh_job("echo hi", 3, Backend("ssh", **env.settings(known_hosts=str(wrong)))))
            with pytest.raises(JobError, match=r"host key of .*127\.0\.0\.1.* is not trusted"):
                await j.submit()
        assert j.status == "new" and j.subjobs == []
        driver = await ssh_driver(orch)
        assert driver.calls["connect"] >= 1 and driver.calls["setup"] == 0 and driver.calls["submit"] == 0
        assert any(e["event"] == "ssh host key rejected" and e["log_level"] == "error" for e in logs)
    assert list(env.workdir.iterdir()) == []  # nothing of ours reached the impostor


async def test_known_hosts_none_connects_and_says_so_loudly(ssh_env: SshEnv, tmp_path: Path) -> None:
    env = ssh_env
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        with capture_logs() as logs:
            j = await orch.jobs.add(sh_job('echo "$0"', 2, Backend("ssh", **env.settings(known_hosts=None))))
            await j.submit()
            await j.wait(timeout=30)
        assert j.status == "completed"
    warnings = [e for e in logs if "HOST KEY CHECKING IS DISABLED" in e["event"]]
    assert warnings and warnings[0]["log_level"] == "warning"


# ------------------------------------------------------------------- the rest
async def test_kill_signals_the_remote_process_group(ssh_env: SshEnv, tmp_path: Path) -> None:
    env = ssh_env
    script = 'sleep 60 & echo $! > child.pid; echo started; wait'
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]),
                                    backend=Backend("ssh", **env.settings())))
        await j.submit()
        with anyio.fail_after(20):
            while j.status != "running":
                await anyio.sleep(0.05)
        pidfiles = list(env.workdir.glob("*/runs/*/work/child.pid"))
        with anyio.fail_after(10):
            while not pidfiles or not pidfiles[0].read_text().strip():
                await anyio.sleep(0.05)
                pidfiles = list(env.workdir.glob("*/runs/*/work/child.pid"))
        child = int(pidfiles[0].read_text())
        assert alive(child)
        await j.kill()
        assert j.status == "killed"
        with anyio.fail_after(10):
            while alive(child):  # the whole group went, not only the wrapper
                await anyio.sleep(0.05)
        assert (await ssh_driver(orch)).calls["kill"] == 1


async def test_kill_of_a_queued_run_cancels_it(ssh_env: SshEnv, side: Path, tmp_path: Path) -> None:
    env = ssh_env
    script = f'echo "$$" >> {side}/"$0"; sleep 1'
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(sh_job(script, 3, Backend("ssh", **env.settings(slots=1))))
        await j.submit()
        await j.subjobs[2].kill()  # still waiting for the only slot
        await j.wait(timeout=30)
        assert [s.status.value for s in j.subjobs] == ["completed", "completed", "killed"]
    assert executions(side, 3) == {0: 1, 1: 1, 2: 0}


async def test_unreachable_host_fails_submission_cleanly(ssh_env: SshEnv, tmp_path: Path) -> None:
    env = ssh_env
    env.sshds[0].stop()
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(sh_job("true", 4, Backend("ssh", **env.settings())))
        started = time.monotonic()
        with pytest.raises(JobError, match="cannot connect to"):
            await j.submit()
        assert time.monotonic() - started < 15
        assert j.status == "new" and j.subjobs == []


async def test_one_host_down_the_other_keeps_reporting(ssh_env2: SshEnv, side: Path, tmp_path: Path) -> None:
    env = ssh_env2
    n = 8
    script = f'echo "$$" >> {side}/"$0"; sleep 1; echo "done $0"'
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(sh_job(script, n, Backend("ssh", **env.settings(slots=4))))
        await j.submit()
        env.sshds[0].stop()
        on_b = [s for s in j.subjobs if host_of(s.backend_id) == env.hosts[1]]
        with anyio.fail_after(30):  # host B's runs are reported while host A is away
            while not all(s.status == "completed" for s in on_b):
                await anyio.sleep(0.05)
        assert any(s.status != "completed" for s in j.subjobs if host_of(s.backend_id) == env.hosts[0])
        env.sshds[0].start()
        await j.wait(timeout=60)
        assert j.status == "completed"
    assert executions(side, n) == {i: 1 for i in range(n)}


@pytest.mark.parametrize(("settings", "field"), [
    ({"workdir": "/w"}, "hosts"),
    ({"hosts": ["u@h:1"]}, "workdir"),
    ({"hosts": ["u@h:1"], "workdir": "relative/dir"}, "workdir"),
    ({"hosts": ["u@h:99999"], "workdir": "/w"}, "hosts"),
    ({"hosts": ["u@bad host"], "workdir": "/w"}, "hosts"),
    ({"hosts": ["u@h", "u@h:22"], "workdir": "/w"}, "hosts"),
    ({"hosts": [], "workdir": "/w"}, "hosts"),
    ({"hosts": ["u@h"], "workdir": "/w", "slots": 0}, "slots"),
    ({"hosts": ["u@h"], "workdir": "/w", "key": "/no/such/key"}, "key"),
    ({"hosts": ["u@h"], "workdir": "/w", "known_hosts": "/no/such/file"}, "known_hosts"),
    ({"hosts": ["u@h"], "workdir": "/w", "colour": "blue"}, "colour"),
])
async def test_settings_errors_name_the_field(settings: dict[str, object], field: str, tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path) as orch:
        with pytest.raises(JobError) as info:
            await orch.jobs.add(Job(application=Executable("/bin/true"), backend=Backend("ssh", **settings)))
        assert info.value.field == f"backend.{field}"


def test_settings_are_normalised() -> None:
    out = validate({"host": "example.org", "user": "ann", "port": 2222, "workdir": "/w//x/"})
    assert out == {"hosts": ["ann@example.org:2222"], "workdir": "/w/x", "slots": 4}
    out = validate({"hosts": ["[::1]:22", "bob@h"], "workdir": "/w", "known_hosts": None, "slots": 2})
    assert out["hosts"][0].endswith("@[::1]:22") and out["hosts"][1] == "bob@h:22" and out["known_hosts"] is None
    assert os.path.isabs(validate({"hosts": ["h"], "workdir": "/w", "key": __file__})["key"])


# ------------------------------------------------- the remote scripts, run locally
def _sh(script: str) -> list[str]:
    done = subprocess.run(["sh", "-s"], input=script.encode(), capture_output=True, timeout=30, check=True)
    return done.stdout.decode().split("\n")


def test_launch_guard_starts_each_run_once_and_kill_cancels(tmp_path: Path) -> None:
    """The guard makes launch idempotent; a kill that takes it first cancels the run for good."""
    base = str(tmp_path / "base with 'quote' $(x)")
    bindir = f"{base}/bin-{SCRIPTS_HASH}"
    _sh(scripts.setup(base, bindir, tuple(SCRIPT_FILES)))
    os.makedirs(bindir)
    for name, data in SCRIPT_FILES.items():
        Path(bindir, name).write_bytes(data)
    runfile = "ORCH_KEY=k1\nORCH_OUTDIR=/dev/null/x\nset -- /bin/true\n"
    preps = [scripts.Prep("k1", runfile), scripts.Prep("k2", runfile)]
    out = _sh(scripts.submit(base, bindir, preps, ["k1"], 1.0))
    assert "P k1" in out and "P k2" in out and any(line.startswith("L k1 ") for line in out) and out[-2] == "OK"
    assert "D k1" in _sh(scripts.launch(base, bindir, ["k1"], 2.0))  # a repeated launch starts nothing
    assert "C k2" in _sh(scripts.kill(base, [("k2", None)], 0.1, 3.0))  # queued: cancelled
    assert "D k2" in _sh(scripts.launch(base, bindir, ["k2"], 4.0))  # ... and never starts afterwards
    out = _sh(scripts.submit(base, bindir, preps, [], 5.0))  # preparing again leaves launched runs alone
    assert "P k1" not in out and "P k2" not in out
    events = [line.split()[:2] for line in Path(base, "events.log").read_text().splitlines()]
    assert events == [["k1", "INTENT"], ["k1", "LAUNCH"], ["k2", "CANCEL"]]  # (this run file has no ORCH_NOTIFY)


async def test_start_command_dropped_after_it_ran(ssh_env: SshEnv, side: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The answer to the start command is lost: the runs are looked up on the host, none runs twice."""
    real = Host.command

    async def lossy(self: Host, kind: str, script: str, tally: dict[str, int] | None = None,
                    timeout: float | None = None) -> bytes:
        out: bytes = await real(self, kind, script, tally, timeout=timeout)
        if kind == "submit":
            self.dropped("injected: answer lost")
            raise Dropped("injected: the connection dropped after the command ran")
        return out

    monkeypatch.setattr(Host, "command", lossy)
    env = ssh_env
    n = 6
    script = f'echo "$$" >> {side}/"$0"; sleep 0.3; echo "done $0"'
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(sh_job(script, n, Backend("ssh", **env.settings(slots=3))))
        await j.submit()
        assert all(s.status == "submitted" for s in j.subjobs)
        await j.wait(timeout=60)
        assert j.status == "completed", [(s.fqid, s.status.value, s.info.reason) for s in j.subjobs]
        assert all((s.outputdir / "stdout").read_text() == f"done {i}\n" for i, s in enumerate(j.subjobs))
    assert executions(side, n) == {i: 1 for i in range(n)}


async def test_start_command_dropped_before_it_ran(ssh_env: SshEnv, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The start command never reached the host: its runs are found absent there, and fail as lost."""
    real = Host.command

    async def lost(self: Host, kind: str, script: str, tally: dict[str, int] | None = None,
                   timeout: float | None = None) -> bytes:
        if kind == "submit":
            raise Dropped("injected: the connection dropped before the command ran")
        out: bytes = await real(self, kind, script, tally, timeout=timeout)
        return out

    monkeypatch.setattr(Host, "command", lost)
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(sh_job("true", 2, Backend("ssh", **ssh_env.settings())))
        await j.submit()
        await j.wait(timeout=30)
        assert [s.status.value for s in j.subjobs] == ["failed", "failed"]
        assert all("never reached" in (s.info.reason or "") for s in j.subjobs)


async def test_runs_nobody_watches_hold_no_slot_after_a_restart(ssh_env: SshEnv, tmp_path: Path) -> None:
    """The events file replayed by a reopened home tells of a killed run: it must not hold the only slot."""
    env = ssh_env
    backend = Backend("ssh", **env.settings(slots=1))
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        a = await orch.jobs.add(Job(application=Executable("/bin/sleep", args=["60"]), backend=backend))
        await a.submit()
        with anyio.fail_after(20):
            while a.status != "running":
                await anyio.sleep(0.05)
        await a.kill()  # SIGTERM to its group: no END line will ever come
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        b = await orch.jobs.add(sh_job('echo "$0"', 2, backend))
        await b.submit()
        await b.wait(timeout=30)
        assert b.status == "completed"
        assert orch.jobs(a.id).status == "killed"


async def test_checkpointed_job_resumes_on_the_remote_host(ssh_env: SshEnv, side: Path, tmp_path: Path) -> None:
    """States go to the host with the run and come back with its output: a crash resumes at the next step."""
    pytest.importorskip("orchestrator.checkpoint", reason="a core without checkpointing")
    steps_file = side / "steps"
    script = (f'while s=$($ORCH_STATE next-step); do echo "$ORCH_RETRY_COUNT $s" >> {steps_file}; '
              '$ORCH_STATE save-value last "$s"; $ORCH_STATE save > /dev/null; '
              'if [ "$s" = 10 ] && [ "$ORCH_RETRY_COUNT" = 0 ]; then kill -KILL 0; fi; done; '
              '$ORCH_STATE final; $ORCH_STATE save > /dev/null; $ORCH_STATE get last')
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]), steps="1..20",
                                    backend=Backend("ssh", **ssh_env.settings())))
        await j.submit()
        await j.wait(timeout=60)
        assert j.status == "completed", j.info.history
        assert j.info.history[0]["level"] == "worker" and j.info.submit_counter == 2
        assert (j.outputdir / "stdout").read_text() == "20\n"
    ran = [line.split() for line in steps_file.read_text().splitlines()]
    assert [int(s) for _, s in ran] == list(range(1, 21))  # every step once: the retry resumed after step 10
    assert {r for r, s in ran if int(s) > 10} == {"1"}


async def test_return_file_through_a_symlinked_directory_is_refused_remotely(ssh_env: SshEnv, side: Path,
                                                                              tmp_path: Path) -> None:
    """On the host as on this machine: a name through a link to a directory outside is refused, and
    the file outside stays where it is."""
    env = ssh_env
    (side / "key.txt").write_text("secret\n")
    script = (f'ln -s {side} linked; echo ok > good; $ORCH_LOG RETURN_FILE linked/key.txt; '
              '$ORCH_LOG SUCCEEDED good')
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]),
                                    backend=Backend("ssh", **env.settings()), outputfiles=["linked/key.txt"]))
        await j.submit()
        await j.wait(timeout=60)
        assert j.status == "completed", j.info.reason
        assert (side / "key.txt").read_text() == "secret\n"
        assert not (j.outputdir / "key.txt").exists()
        assert any("linked/key.txt" in h["reason"] for h in j.info.history if h["verdict"] == "refused")
        assert "REFUSED linked/key.txt" in (j.outputdir / "orch.log").read_text()


async def test_an_output_pattern_that_matched_nothing_remotely_fails_the_run(ssh_env: SshEnv, tmp_path: Path) -> None:
    """The remote wrapper says NOMATCH as the local one does: subjob 1 left no *.root and fails, naming it."""
    script = 'if [ "$0" = 0 ]; then echo x > x.root; fi'
    async with Orchestrator(home=tmp_path, config=FAST) as orch:
        j = await orch.jobs.add(sh_job(script, 2, Backend("ssh", **ssh_env.settings()), outputfiles=["*.root"]))
        await j.submit()
        await j.wait(timeout=60)
        assert [s.status.value for s in j.subjobs] == ["completed", "failed"], j.subjobs[1].info.reason
        assert (j.subjobs[0].outputdir / "x.root").read_text() == "x\n"
        assert j.subjobs[1].info.reason.startswith("output file pattern '*.root' matched nothing")
