"""Useful and wasted CPU (GBS): a checkpointed job stopped twice mid-run and resumed, reported per cause; the
service's metrics add up the same records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from served import Service

from orchestrator import ArgSplitter, Executable, Job, Orchestrator
from orchestrator import checkpoint as checkpoint_module

pytestmark = pytest.mark.anyio

EXE = str(Path(sys.executable).with_name("orchestrator"))

#: Burns CPU: 0.4 s of set-up before any state is saved, then 0.05 s per step, saving after each.
BURNER = '''
import os, time
from checkpoint import State

def burn(seconds):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass

state = State()
with open(os.environ["MARKS"], "a") as f:
    f.write(f"{os.environ['ORCH_ATTEMPT']} {state.label}\\n")
burn(0.4)
while (step := state.get_next_step()) is not None:
    burn(0.05)
    state.save_value("last", step)
    state.save_state()
state.set_final_state()
state.save_state()
'''


def records(outputdir: Path) -> dict[int, tuple[int, float]]:
    """Each attempt's own record in ``orch.usage``, read here without the orchestrator's parser: attempt ->
    (exit code, CPU seconds). A record is a head line, then the shell's ``times``: the wrapper's user and system
    time, then its children's (``0m1.250000s 0m0.010000s``)."""
    lines = (outputdir / "orch.usage").read_text().splitlines()
    out = {}
    for k in range(0, len(lines), 3):
        head, own, children = lines[k].split(), lines[k + 1].split(), lines[k + 2].split()
        seconds = 0.0
        for field in (*own, *children):
            minutes, rest = field.rstrip("s").split("m")
            seconds += int(minutes) * 60 + float(rest)
        out[int(head[0])] = (int(head[5]), seconds)
    return out


def stop(outputdir: Path, attempt: int) -> None:
    """SIGTERM to the attempt's process group (as a kill or a batch system's preemption would)."""
    pid = int((outputdir / f"orch.{attempt}.log").read_text().split()[2])
    os.killpg(pid, signal.SIGTERM)


async def test_cpu_of_resumed_attempts_is_useful_and_the_rest_wasted(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    script = tmp_path / "burner.py"
    script.write_text(BURNER)
    home = tmp_path / "home"
    async with Orchestrator(home=home, config={"core": {"poll_interval": 0.05}}) as orch:
        job = await orch.jobs.add(Job(name="burner", application=Executable(sys.executable, ["burner.py"],
                                                                             env={"MARKS": str(marks)}),
                                      inputfiles=[str(script), checkpoint_module.__file__], steps="1..40",
                                      backend="local"))
        await job.submit()
        with anyio.fail_after(30):  # attempt 1 is in its set-up: nothing saved yet
            while not marks.exists():
                await anyio.sleep(0.02)
        await anyio.sleep(0.15)
        stop(job.outputdir, 1)
        with anyio.fail_after(30):  # attempt 2 (the automatic resumption) saves states
            while job.info.submit_counter < 2 or job.info.checkpoint.get("seq", 0) < 10:
                await anyio.sleep(0.02)
        stop(job.outputdir, 2)
        await job.wait(timeout=60)
        assert job.status == "completed", job.info.history
        assert [line.split()[0] for line in marks.read_text().splitlines()] == ["1", "2", "3"]
        assert [h["level"] for h in job.info.history] == ["worker", "worker"]

    done = subprocess.run([EXE, "--home", str(home), "report", "0", "--json"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # The attempts' own records: attempt 1 stopped before it saved anything (nobody resumed from it: wasted),
    # attempt 2 saved states that attempt 3 resumed from (useful), attempt 3 completed (useful).
    lines = (job.outputdir / "orch.usage").read_text().splitlines()
    heads = [line.split() for line in lines[0::3]]
    assert [(h[0], h[5]) for h in heads] == [("1", "143"), ("2", "143"), ("3", "0")]
    assert heads[0][1] == heads[0][2] == heads[1][1] and int(heads[2][1]) >= 10
    cpu = {attempt: seconds for attempt, (_, seconds) in records(job.outputdir).items()}
    assert report["attempts"] == 3
    assert report["wasted"] == pytest.approx(cpu[1], abs=1e-6)  # nobody resumed from attempt 1
    assert report["useful"] == pytest.approx(cpu[2] + cpu[3], abs=1e-6)  # resumed from; completed
    assert report["cpu"] == pytest.approx(cpu[1] + cpu[2] + cpu[3], abs=1e-6)
    assert report["cpu"] == pytest.approx(report["useful"] + report["wasted"])
    assert cpu[1] > 0.05 and cpu[3] > 0.3  # they burnt what they were made to: the records are not empty
    assert report["wasted_by_cause"] == {"worker: early": pytest.approx(cpu[1], abs=1e-6)}

    text = subprocess.run([EXE, "--home", str(home), "report", "0"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "120"}).stdout
    assert "useful" in text and "wasted" in text and "worker: early" in text

    shown = subprocess.run([EXE, "--home", str(home), "show", "0", "--json"], capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["cpu"] == report  # show gives what report gives
    text = subprocess.run([EXE, "--home", str(home), "show", "0"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "160"}).stdout
    cpu_line = next(line for line in text.splitlines() if line.startswith("cpu"))
    assert "3 attempts" in cpu_line and "useful" in cpu_line and "wasted" in cpu_line and "worker: early" in cpu_line


#: Burns CPU for a while, then exits with the code it is given.
SPIN = "i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done; exit $1"


def scraped(text: str, kind: str) -> float:
    prefix = f'orchestrator_cpu_seconds_total{{backend="local",kind="{kind}"}} '
    return sum(float(line.removeprefix(prefix)) for line in text.splitlines() if line.startswith(prefix))


async def test_metrics_count_useful_and_wasted_cpu_as_report_does(tmp_path: Path, services: list[Service]) -> None:
    home = tmp_path / "home"
    service = Service(home, "--tcp-port", "0")
    services.append(service.start())
    async with Orchestrator(home=home) as orch:
        job = await orch.jobs.add(Job(name="spin", application=Executable("/bin/sh"), backend="local",
                                      splitter=ArgSplitter([["-c", SPIN, "spin", code] for code in "0030"])))
        await job.submit()
        await job.wait(timeout=60)
        assert [s.status for s in job.subjobs] == ["completed", "completed", "failed", "completed"]
    report = json.loads(subprocess.run([EXE, "--home", str(home), "report", "0", "--json"], capture_output=True,
                                       text=True, timeout=60, check=True).stdout)
    ended = [records(sub.outputdir)[1] for sub in job.subjobs]  # one attempt each: (exit code, CPU)
    assert [code for code, _ in ended] == [0, 0, 3, 0]
    assert report["useful"] == pytest.approx(sum(cpu for code, cpu in ended if code == 0), abs=1e-6)
    assert report["wasted"] == pytest.approx(sum(cpu for code, cpu in ended if code != 0), abs=1e-6)
    assert report["useful"] > 0 and report["wasted"] > 0
    headers = {"Authorization": f"Bearer {service.token}"}
    with anyio.fail_after(20):  # the records are read off the loop, shortly after the runs end
        while True:
            text = httpx.get(f"{service.url}/metrics", headers=headers).text
            if scraped(text, "useful") and scraped(text, "wasted"):
                break
            await anyio.sleep(0.2)
    assert scraped(text, "useful") == pytest.approx(report["useful"])
    assert scraped(text, "wasted") == pytest.approx(report["wasted"])


async def _metric(service: Service, kind: str, want: float, within: float = 30) -> float:
    """The scraped CPU of ``kind`` once it reaches ``want`` (the records are read off the loop), or at ``within``."""
    headers = {"Authorization": f"Bearer {service.token}"}
    got = 0.0
    with anyio.move_on_after(within):
        while True:
            got = scraped(httpx.get(f"{service.url}/metrics", headers=headers).text, kind)
            if got >= want - 1e-6:
                break
            await anyio.sleep(0.2)
    return got


async def test_metrics_count_an_attempt_a_retry_resumed_from_as_useful(tmp_path: Path,
                                                                      services: list[Service]) -> None:
    """The report's computation and the metric's are one: attempt 2 saved states that attempt 3 resumed from, so
    its CPU is useful in both (the metric counted it wasted when it ended, before the retry resumed from it)."""
    marks = tmp_path / "marks"
    script = tmp_path / "burner.py"
    script.write_text(BURNER)
    home = tmp_path / "home"
    service = Service(home, "--tcp-port", "0")
    services.append(service.start())
    async with Orchestrator(home=home) as orch:
        job = await orch.jobs.add(Job(name="burner", application=Executable(sys.executable, ["burner.py"],
                                                                             env={"MARKS": str(marks)}),
                                      inputfiles=[str(script), checkpoint_module.__file__], steps="1..40",
                                      backend="local"))
        await job.submit()
        with anyio.fail_after(30):
            while not marks.exists():
                await anyio.sleep(0.02)
        await anyio.sleep(0.15)
        stop(job.outputdir, 1)
        with anyio.fail_after(30):
            while job.info.submit_counter < 2 or job.info.checkpoint.get("seq", 0) < 10:
                await anyio.sleep(0.05)
        stop(job.outputdir, 2)
        await job.wait(timeout=60)
        assert job.status == "completed", job.info.history
    report = json.loads(subprocess.run([EXE, "--home", str(home), "report", "0", "--json"], capture_output=True,
                                       text=True, timeout=60, check=True).stdout)
    cpu = {attempt: seconds for attempt, (_, seconds) in records(job.outputdir).items()}
    assert report["useful"] == pytest.approx(cpu[2] + cpu[3], abs=1e-6) and report["wasted"] > 0
    assert await _metric(service, "useful", report["useful"]) == pytest.approx(report["useful"])
    assert await _metric(service, "wasted", report["wasted"]) == pytest.approx(report["wasted"])


#: Ignores the first SIGTERM and burns on for a while before it exits: its wrapper writes the attempt's record only
#: then, well after the run was recorded killed.
STUBBORN = ('trap "stop=1" TERM; echo up > "$1"; i=0; n=0; '
            'while [ $n -lt 400000 ]; do i=$((i+1)); if [ -n "${stop:-}" ]; then n=$((n+1)); fi; done; exit 1')


async def test_metrics_count_a_killed_attempt_whose_record_comes_late(tmp_path: Path,
                                                                     services: list[Service]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text("[backends.local]\nkill_grace = 60.0\n")  # never SIGKILLed here
    service = Service(home, "--tcp-port", "0")
    services.append(service.start())
    ups = [tmp_path / f"up{i}" for i in range(2)]
    async with Orchestrator(home=home) as orch:
        job = await orch.jobs.add(Job(name="stubborn", application=Executable("/bin/sh"), backend="local",
                                      splitter=ArgSplitter([["-c", STUBBORN, "stubborn", str(up)] for up in ups])))
        await job.submit()
        with anyio.fail_after(30):
            while not all(up.exists() for up in ups):
                await anyio.sleep(0.05)
        await job.kill()
        await job.wait(timeout=30)
        assert [s.status for s in job.subjobs] == ["killed", "killed"]
        assert not any((s.outputdir / "orch.usage").exists() for s in job.subjobs)  # not yet: they burn on
        with anyio.fail_after(60):  # the wrappers write the records once their applications stopped
            while not all((s.outputdir / "orch.usage").exists() for s in job.subjobs):
                await anyio.sleep(0.1)
    report = json.loads(subprocess.run([EXE, "--home", str(home), "report", "0", "--json"], capture_output=True,
                                       text=True, timeout=60, check=True).stdout)
    assert report["attempts"] == 2 and report["wasted"] > 0 and report["useful"] == 0
    assert await _metric(service, "wasted", report["wasted"]) == pytest.approx(report["wasted"])
