"""A home is always watched while it has active jobs: a command that leaves active jobs behind starts the home's
service in the background (``serve --watcher``), which stops by itself once nothing is active for a while; a
home under supervisord never gets a second one; with autostart off, the listings say nobody watches."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from supervised import Supervised

from orchestrator import ArgSplitter, Executable, Job, Orchestrator, TextMerger

EXE = str(Path(sys.executable).with_name("orchestrator"))


def env() -> dict[str, str]:
    """This environment, with the watcher's default (on) whatever the caller set."""
    return {k: v for k, v in os.environ.items() if k != "ORCHESTRATOR_AUTOSTART"}


def cli(home: Path, *args: str, code: int | None = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([EXE, "--home", str(home), *args], capture_output=True, text=True, timeout=120,
                          env=env(), stdin=subprocess.DEVNULL)
    if code is not None:
        assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    return done


def watchers(home: Path) -> list[int]:
    """The PIDs of the live ``serve --watcher`` processes of ``home`` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"--watcher" in line and str(home).encode() in line and state != "Z":
            found.append(int(entry.name))
    return found


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "home"
    path.mkdir()
    (path / "orchestrator.toml").write_text("[service]\nwatcher_quiet_seconds = 3.0\n")
    yield path
    for pid in watchers(path):  # by PID, whatever a failed test left
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def scan_file(tmp_path: Path, seconds: int = 2) -> Path:
    path = tmp_path / "scan.toml"
    path.write_text('name = "scan"\noutputfiles = ["point.txt"]\n[application]\nexe = "/bin/sh"\n'
                    '[backend]\nname = "local"\n[splitter]\ntype = "args"\nrange = "0-5"\n'
                    f'template = ["-c", "sleep {seconds}; echo {{}} > point.txt", "{{}}"]\n'
                    '[merger]\ntype = "text"\nfiles = ["point.txt"]\n')
    return path


def wait_for(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.2)
    return False


def test_a_submitted_job_file_ends_and_merges_with_nobody_looking(tmp_path: Path, home: Path) -> None:
    job = cli(home, "submit", str(scan_file(tmp_path))).stdout.strip()
    merged = home / "workspace" / job / "output" / "point.txt"
    # nothing else is run: the watcher alone sees the runs end and merges them
    assert wait_for(merged.exists, 30), (home / "service" / "watcher.log").read_text()
    assert merged.read_text().split() == [str(i) for i in range(6)]
    listed = json.loads(cli(home, "jobs", "--json").stdout)["jobs"]
    assert [(j["fqid"], j["status"]) for j in listed] == [(job, "completed")]
    # quiet for watcher_quiet_seconds: it stopped by itself, leaving no process behind
    assert wait_for(lambda: not watchers(home), 20), watchers(home)
    log = (home / "service" / "watcher.log").read_text()
    assert '"event": "stopping: nothing active"' in log and '"code": 0' in log
    assert (home / "service" / "watcher.log").stat().st_mode & 0o077 == 0


def test_a_script_that_closes_with_runs_going_leaves_them_watched(home: Path) -> None:
    async def main() -> str:
        async with Orchestrator(home=home) as orch:
            script = "sleep 1; echo $0"
            j = await orch.jobs.add(Job(name="py", application=Executable("/bin/sh"),
                                        splitter=ArgSplitter([["-c", script, "a"], ["-c", script, "b"]]),
                                        merger=TextMerger(files=["stdout"]), backend="local"))
            await j.submit()
            return j.fqid

    old = os.environ.pop("ORCHESTRATOR_AUTOSTART", None)
    try:
        job = anyio.run(main)
    finally:
        if old is not None:
            os.environ["ORCHESTRATOR_AUTOSTART"] = old
    merged = home / "workspace" / job / "output" / "stdout"
    assert wait_for(merged.exists, 30)
    assert merged.read_text().split() == ["a", "b"]


def test_two_watchers_racing_leave_one(home: Path, tmp_path: Path) -> None:
    jobfile = scan_file(tmp_path)
    jobfile.write_text(jobfile.read_text().replace("sleep 2", "sleep 60"))
    job = cli(home, "submit", str(jobfile)).stdout.strip()  # starts a watcher; three more race it
    starts = [subprocess.Popen([EXE, "--home", str(home), "serve", "--watcher"], env=env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(3)]
    assert wait_for(lambda: len(watchers(home)) == 1 and sum(p.poll() is None for p in starts) <= 1, 60), \
        watchers(home)
    ended = [p for p in starts if p.poll() is not None]
    assert len(ended) >= 2
    assert all(p.returncode == 0 for p in ended) and all(p.stderr is not None and p.stderr.read() == b""
                                                         for p in ended)
    # a command while it watches goes through it and starts nothing more
    cli(home, "kill", job)
    assert len(watchers(home)) <= 1
    for p in starts:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=30)


def test_a_home_under_supervisord_never_gets_a_watcher(tmp_path: Path, home: Path) -> None:
    job = cli(home, "submit", str(scan_file(tmp_path))).stdout.strip()
    assert wait_for(lambda: len(watchers(home)) == 1, 10)
    supervised = Supervised(home)
    supervised.start()
    try:
        anyio.run(supervised.ready)
        # the supervised service took over from the watcher, which stopped
        assert wait_for(lambda: not watchers(home), 20)
        cli(home, "wait", job, "--timeout", "60")
        # the service stops (as for an upgrade): a command leaving active jobs then starts no watcher
        supervised.stop()
        again = cli(home, "submit", str(scan_file(tmp_path))).stdout.strip()
        assert again
        time.sleep(2)
        assert not watchers(home)
        assert (home / "service" / "managed").exists()
    finally:
        supervised.stop()


def test_with_autostart_off_the_listings_say_nobody_watches(tmp_path: Path) -> None:
    home = tmp_path / "quiet"
    home.mkdir()
    (home / "orchestrator.toml").write_text("[service]\nautostart = false\n")
    # runs of 60 s, killed at the end: still active through both listings, however loaded the machine
    job = cli(home, "submit", str(scan_file(tmp_path, 60))).stdout.strip()
    time.sleep(1)
    assert not watchers(home)
    for args in (("jobs",), ("show", job)):
        said = cli(home, *args).stderr
        assert f"note: nobody watches {home}" in said and "last open 20" in said, said
        assert f"orchestrator --home {home} serve" in said
    cli(home, "kill", job)
    assert "nobody watches" not in cli(home, "jobs").stderr  # nothing active: nothing to say
