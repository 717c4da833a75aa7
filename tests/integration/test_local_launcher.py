"""``local``'s launcher: one long-lived process of the home starts the runs that need nothing of the wrapper's
shell, and writes what the wrapper writes (``docs/reference.md``, "local")."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import anyio
import pytest
from test_local import alive
from test_service_owners import open_dir

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator, RetryPolicy
from orchestrator.core.usage import parse_usage

pytestmark = pytest.mark.anyio
__all__ = ["open_dir"]  # a fixture, used by name


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def unexeced_children(pid: int) -> list[int]:
    """The children of ``pid`` that still run its program: started, not yet at their own (``exec``)."""
    own = Path(f"/proc/{pid}/cmdline").read_bytes()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and parent_of(int(entry.name)) == pid and (entry / "cmdline").read_bytes() == own:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def other_user() -> None:
    """Skips unless another OS user (orch-alice) can be run as: root, ``runuser`` and the user exist."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser: the client must run as another OS user")
    try:
        pwd.getpwnam("orch-alice")
    except KeyError:
        pytest.skip("no OS user orch-alice")


async def test_a_run_is_its_program_started_by_the_homes_launcher_with_the_wrappers_records(tmp_path: Path) -> None:
    """No shell between: the run's process is its program, a child of one launcher for the whole home; its log,
    events and CPU record are the wrapper's, word for word in form; the wrapper's environment reaches it."""
    script = 'echo $$ > ../output/me; echo $PPID > ../output/parent; pwd -L > ../output/pwd; env > ../output/env.txt'
    async with Orchestrator(home=tmp_path / "home") as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]), backend="local",
                                    splitter=ArgSplitter([["-c", script]] * 3)))
        await j.submit()
        await j.wait(timeout=30)
        assert j.status == "completed"
        parents = set()
        for sub in j.subjobs:
            out = sub.outputdir
            me, parent = int((out / "me").read_text()), int((out / "parent").read_text())
            parents.add(parent)
            log = (out / "orch.log").read_text().splitlines()
            assert log[0].split()[1:3] == ["START", str(me)] and log[-2].split()[1:] == ["EXIT", "0"]
            assert log[-1].split()[1:] == ["END", "0"]
            [attempt] = parse_usage((out / "orch.usage").read_text())
            assert (attempt.attempt, attempt.code) == (1, 0) and attempt.end >= attempt.start
            assert (out / "pwd").read_text().strip() == str((sub.workspace / "work").resolve())
            seen = dict(line.split("=", 1) for line in (out / "env.txt").read_text().splitlines() if "=" in line)
            assert seen["ORCH_FQID"] == sub.fqid and seen["ORCH_JOBLOG"] == f"{out}/orch.1.log"
            assert seen["ORCH_LOG"].endswith("/orch-log") and seen["ORCH_STATE"].endswith("/orch-state")
            assert not {"ORCH_KEY", "ORCH_OUTDIR", "ORCH_NOTIFY", "ORCH_BIN", "ORCH_OUTPUTFILES"} & seen.keys()
        [launcher] = parents
        assert launcher != os.getpid()
        events = (tmp_path / "home" / "backends" / "local" / "events.log").read_text()
        assert events.count(" START ") == 3 and events.count(" END 0 ") == 3


async def test_programs_are_found_as_the_shell_finds_them(tmp_path: Path) -> None:
    """A name without a slash is looked up in the run's PATH; a script without ``#!`` runs under ``sh``; a name
    found nowhere ends the run with 127 and the shell's words on its stderr, as the wrapper's shell would."""
    plain = tmp_path / "plain-script"
    plain.write_text('echo "plain $1"\n')
    plain.chmod(0o755)
    async with Orchestrator(home=tmp_path / "home") as orch:
        found = await orch.jobs.add(Job(application=Executable("env"), backend="local"))
        script = await orch.jobs.add(Job(application=Executable(str(plain), args=["ran"]), backend="local"))
        missing = await orch.jobs.add(Job(application=Executable("no-such-program-anywhere"), backend="local"))
        for j in (found, script, missing):
            await j.submit()
        for j in (found, script, missing):
            await j.wait(timeout=30)
        assert found.status == "completed" and "PATH=" in (found.outputdir / "stdout").read_text()
        assert script.status == "completed" and (script.outputdir / "stdout").read_text() == "plain ran\n"
        assert missing.status == "failed" and missing.info.history[-1]["exit_code"] == 127
        assert "no-such-program-anywhere: not found" in (missing.outputdir / "stderr").read_text()


CRASH_WHILE_RUNNING = '''
import anyio, os, signal, sys
from orchestrator import Executable, Job, Orchestrator

async def main(home):
    async with Orchestrator(home=home) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", "sleep 1; exit 3"]),
                                    backend="local"))
        await j.submit()
        with anyio.fail_after(20):
            while not (j.workspace / "output" / "orch.1.log").exists():
                await anyio.sleep(0.02)
        os.kill(os.getpid(), signal.SIGKILL)

anyio.run(main, sys.argv[1])
'''


async def test_the_launcher_records_an_end_while_no_orchestrator_runs(tmp_path: Path) -> None:
    """The orchestrator is killed while its run runs: the launcher, not in the orchestrator's process tree, writes
    the run's EXIT, END and CPU record all the same, and the next process reads them."""
    home = tmp_path / "home"
    proc = subprocess.run([sys.executable, "-c", CRASH_WHILE_RUNNING, str(home)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    log = home / "workspace" / "0" / "output" / "orch.1.log"
    with anyio.fail_after(20):
        while "END" not in log.read_text():
            await anyio.sleep(0.05)
    assert [line.split()[1:] for line in log.read_text().splitlines()][-2:] == [["EXIT", "3"], ["END", "3"]]
    async with Orchestrator(home=home) as orch:
        j = orch.jobs[0]
        await j.wait(timeout=30)
        assert j.status == "failed" and j.info.history[-1]["exit_code"] == 3


async def test_a_killed_launcher_loses_its_runs_and_the_next_runs_get_a_new_one(tmp_path: Path) -> None:
    """SIGKILL to the launcher: its runs go on, watched by their pids, and are failed as lost when they end (no
    one recorded their end); the runs after them start under a new launcher."""
    async with Orchestrator(home=tmp_path / "home") as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", "sleep 0.6"]), backend="local"))
        await j.submit()
        log = j.outputdir / "orch.1.log"
        with anyio.fail_after(20):
            while j.status != "running":  # the launcher told the driver the run's pid (it is watched by it)
                await anyio.sleep(0.02)
        launcher = parent_of(int(log.read_text().split()[2]))
        os.kill(launcher, signal.SIGKILL)
        await j.wait(timeout=30)
        assert j.status == "failed" and "without an END line" in (j.info.reason or "")
        again = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", "echo $PPID"]),
                                        backend="local"))
        await again.submit()
        await again.wait(timeout=30)
        assert again.status == "completed"
        assert int((again.outputdir / "stdout").read_text()) not in (launcher, os.getpid())


async def test_a_run_the_launcher_cannot_take_keeps_the_wrapper(tmp_path: Path) -> None:
    """A run with its own shell starts as ``shell wrapper.sh --env KEY ...``, as before (the launcher takes only
    runs that need nothing of the wrapper's shell)."""
    script = 'tr "\\0" " " < /proc/$PPID/cmdline > ../output/parent'
    async with Orchestrator(home=tmp_path / "home") as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]),
                                    backend=Backend("local", shell="/bin/dash")))
        await j.submit()
        await j.wait(timeout=30)
        assert j.status == "completed"
        assert (j.outputdir / "parent").read_text().startswith("/bin/dash ")


async def test_another_user_cannot_reach_the_launcher(open_dir: Path) -> None:
    """The launcher starts whatever it is sent, as the orchestrator's user: its socket is 0600, and another OS user
    who can reach the directory is refused."""
    other_user()
    home = open_dir / "home"
    async with Orchestrator(home=home) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", "sleep 1"]), backend="local"))
        await j.submit()
        sock = home / "backends" / "local" / "launcher.sock"
        with anyio.fail_after(20):
            while not sock.exists():
                await anyio.sleep(0.02)
        assert sock.stat().st_mode & 0o777 == 0o600
        probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect(sys.argv[1])\n"
                 "except OSError as e:\n    print(type(e).__name__)\nelse:\n    print('connected')")
        done = subprocess.run(["runuser", "-u", "orch-alice", "--", "/usr/bin/python3", "-c", probe, str(sock)],
                              capture_output=True, text=True, timeout=30)
        assert done.stdout.strip() == "PermissionError", done
        await j.wait(timeout=30)
        assert j.status == "completed"


def test_the_launcher_serves_only_its_own_user(tmp_path: Path) -> None:
    """Should the socket be reachable, a process of another user is answered by a closed connection: the launcher
    checks its peer's uid (``SO_PEERCRED``) before it reads a word."""
    other_user()
    where = Path(tempfile.mkdtemp(prefix="orch-launcher-"))
    try:
        where.chmod(0o755)
        address = where / "l.sock"
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(address))
        address.chmod(0o666)  # reachable by anyone: only the launcher's own check stands
        listener.listen(4)
        program = Path(__file__).parents[2] / "plugins" / "orch_local" / "launcher.py"
        pid = os.posix_spawn(sys.executable, [sys.executable, "-I", "-S", str(program), str(where / "events.log")],
                             os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, listener.fileno(), 3)])
        assert os.waitpid(pid, 0)[1] == 0  # it forks and leaves: the launcher lives on
        listener.close()
        probe = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ns.settimeout(10)\n"
                 "print(repr(s.recv(100)))")
        done = subprocess.run(["runuser", "-u", "orch-alice", "--", "/usr/bin/python3", "-c", probe, str(address)],
                              capture_output=True, text=True, timeout=30)
        assert done.stdout.strip() == "b''", done  # closed at once: no R, nothing started
        mine = socket.socket(socket.AF_UNIX)
        mine.connect(str(address))
        mine.settimeout(10)
        assert mine.recv(100) == b"\0\0\0\x01R"  # its own user is told its runs (none)
        mine.close()
        deadline = time.monotonic() + 20
        while any(alive(int(p)) and str(where) in Path(f"/proc/{p}/cmdline").read_text(errors="replace")
                  for p in os.listdir("/proc") if p.isdigit()) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        shutil.rmtree(where, ignore_errors=True)


async def test_the_driver_lets_go_of_every_ended_run(tmp_path: Path) -> None:
    """Runs end faster than the launcher's word of them comes (their END lines are read first): once all have
    ended, the driver holds none of them (it held some thousands after 100,000 runs before this was mended)."""
    async with Orchestrator(home=tmp_path / "home", config={"backends": {"local": {"max_running": 2}}}) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/true"), backend="local",
                                    splitter=ArgSplitter([[] for _ in range(300)])))
        await j.submit()
        await j.wait(timeout=120)
        assert j.status == "completed"
        driver = (await orch.metrics())["backends"]["local"]["driver"]
        assert driver["launched"] == 300 and driver["running"] == 0 and driver["tracked"] == 0, driver


async def test_runs_sent_ahead_wait_at_the_launcher_and_one_killed_there_never_starts(tmp_path: Path) -> None:
    """Past ``max_running``, runs wait at the launcher, which starts each as a slot frees up (never more than
    ``max_running`` at once); a run killed, or forced to an end, while it waits there never starts."""
    side = tmp_path / "log"
    script = f'echo start >> {side}; sleep 0.4; echo end >> {side}'
    config = {"backends": {"local": {"max_running": 1}}}
    async with Orchestrator(home=tmp_path / "home", config=config) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", script]), backend="local",
                                    splitter=ArgSplitter([["-c", script]] * 4)))
        await j.submit()
        with anyio.fail_after(20):
            while j.subjobs[0].status != "running":
                await anyio.sleep(0.02)
        driver = (await orch.metrics())["backends"]["local"]["driver"]
        assert (driver["running"], driver["ahead"], driver["queued"]) == (1, 3, 0), driver
        await j.subjobs[3].kill()
        await j.subjobs[2].force_status("failed", force=True)  # the driver lets go of it: it never starts either
        await j.wait(timeout=30)
        assert [s.status for s in j.subjobs] == ["completed", "completed", "failed", "killed"]
        for sub in j.subjobs[2:]:
            assert not (sub.outputdir / "orch.1.log").exists()  # never started: nothing was written
        [first], [second] = (parse_usage((sub.outputdir / "orch.usage").read_text()) for sub in j.subjobs[:2])
        assert second.start >= first.end  # its start is when it started, not when it was sent
    lines = side.read_text().split()
    assert lines == ["start", "end"] * 2  # one at a time


CRASH_WITH_RUNS_AHEAD = '''
import anyio, os, signal, sys
from orchestrator import ArgSplitter, Executable, Job, Orchestrator

async def main(home, side):
    script = 'echo "$1 $PPID" >> "$2"; sleep 0.2'
    args = [["-c", script, "sh", str(i), side] for i in range(5)]
    async with Orchestrator(home=home, config={"backends": {"local": {"max_running": 1}}}) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh"), splitter=ArgSplitter(args), backend="local"))
        await j.submit()
        with anyio.fail_after(20):
            while not os.path.exists(side):
                await anyio.sleep(0.02)
        os.kill(os.getpid(), signal.SIGKILL)  # one running, four waiting at the launcher

anyio.run(main, sys.argv[1], sys.argv[2])
'''


async def test_runs_waiting_at_the_launcher_run_while_no_orchestrator_does_each_once(tmp_path: Path) -> None:
    """The orchestrator is killed while runs wait at the launcher: the launcher starts them all the same, one at a
    time, and the next process finds them ended, each run once."""
    home, side = tmp_path / "home", tmp_path / "ran"
    proc = subprocess.run([sys.executable, "-c", CRASH_WITH_RUNS_AHEAD, str(home), str(side)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with anyio.fail_after(20):  # no orchestrator runs meanwhile
        while len(side.read_text().splitlines()) < 5:
            await anyio.sleep(0.05)
    ran = [line.split() for line in side.read_text().splitlines()]
    assert sorted(i for i, _ in ran) == [str(i) for i in range(5)]
    assert len({parent for _, parent in ran}) == 1  # the one launcher
    async with Orchestrator(home=home, config={"backends": {"local": {"max_running": 1}}}) as orch:
        j = orch.jobs[0]
        await j.wait(timeout=30)
        assert j.status == "completed" and {s.info.submit_counter for s in j.subjobs} == {1}
    assert len(side.read_text().splitlines()) == 5


async def test_a_launcher_killed_with_runs_waiting_in_it_never_lets_more_than_max_running_run(tmp_path: Path) -> None:
    """SIGKILL to the launcher while two runs run in it and more wait there: the two go on, on their own, and
    count against ``max_running`` until they end (lost); the waiting ones are judged after ``start_timeout`` and
    started under a new launcher; never more than two run at once, and every other run completes."""
    side = tmp_path / "log"
    script = f'echo start >> {side}; sleep "$1"; echo end >> {side}'
    config = {"backends": {"local": {"max_running": 2, "start_timeout": 1.0}}}
    seconds = ["3"] * 2 + ["0.2"] * 38  # the first two outlive start_timeout
    async with Orchestrator(home=tmp_path / "home", config=config) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh"), backend="local",
                                    splitter=ArgSplitter([["-c", script, "sh", t] for t in seconds])))
        await j.submit()
        logs = [sub.outputdir / "orch.1.log" for sub in j.subjobs[:2]]
        with anyio.fail_after(20):
            while not all(sub.status == "running" for sub in j.subjobs[:2]):  # their pids told to the driver
                await anyio.sleep(0.01)
        os.kill(parent_of(int(logs[0].read_text().split()[2])), signal.SIGKILL)
        await j.wait(timeout=60)
        statuses = [s.status for s in j.subjobs]
        assert statuses[:2] == ["failed"] * 2 and statuses[2:] == ["completed"] * 38, statuses
    running = peak = 0
    for line in side.read_text().split():
        running += 1 if line == "start" else -1
        peak = max(peak, running)
    assert peak <= 2


async def test_a_launcher_slow_to_answer_is_not_replaced(tmp_path: Path) -> None:
    """Something listens on the launcher's socket but does not answer: no second launcher is started beside it
    (runs waiting in a slow one would be taken for never started); the runs start through the wrapper."""
    statedir = tmp_path / "home" / "backends" / "local"
    statedir.mkdir(parents=True)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(statedir / "launcher.sock"))
    os.chmod(statedir / "launcher.sock", 0o600)
    silent.listen(8)
    made = os.stat(statedir / "launcher.sock").st_ino
    try:
        async with Orchestrator(home=tmp_path / "home") as orch:
            j = await orch.jobs.add(Job(application=Executable("/bin/sh", args=["-c", "echo ran"]), backend="local",
                                        splitter=ArgSplitter([["-c", "echo ran"]] * 3)))
            await j.submit()
            await j.wait(timeout=60)
            assert j.status == "completed"
            assert all((s.outputdir / "stdout").read_text() == "ran\n" for s in j.subjobs)
        assert os.stat(statedir / "launcher.sock").st_ino == made  # the same socket: no launcher was started
    finally:
        silent.close()


async def test_runs_a_killed_orchestrator_sent_last_are_told_to_the_next_connection(tmp_path: Path) -> None:
    """An orchestrator sends its runs and is killed before the launcher has read them; the next one connects. The
    launcher takes what the dead connection holds before it tells the new one its runs (``R``): every run sent is
    named there, started or waiting. Told nothing of a run it then started, the next orchestrator found its START
    with no launcher's word of it and judged it lost while it ran (the conformance kit's
    ``test_orchestrator_killed_mid_submission_then_reopened`` failed on it, about one time in three, under load)."""
    from orch_local.hosted import Launcher
    from orch_local.launcher import frame

    state = tmp_path / "state"
    state.mkdir()
    out = os.open(tmp_path / "wrapper.out", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    first = Launcher(state, state / "events.log", out, most=1)
    assert first.connect(start=True)  # a launcher of its own, still starting: it has accepted nobody yet
    sent = b""
    for i in range(3):
        (tmp_path / str(i) / "output").mkdir(parents=True)
        (tmp_path / str(i) / "work").mkdir()
        sent += frame(b"S", b"key-%d" % i, b"1", b"%s/%d/output" % (os.fsencode(tmp_path), i),
                      b"%s/%d/work" % (os.fsencode(tmp_path), i), os.fsencode(tmp_path), b"-", b"3",
                      b"/bin/sh", b"-c", b"sleep 0.2")
    assert first.send(sent)
    assert first.sock is not None
    first.sock.close()  # killed: its last runs wait in its socket
    second = Launcher(state, state / "events.log", out, most=1)
    try:
        assert second.connect(start=False)
        assert sorted(second.runs) == ["key-0", "key-1", "key-2"]  # from its first message, before any await
        with anyio.fail_after(20):
            while (state / "events.log").read_text().count(" END ") < 3:
                await anyio.sleep(0.05)
    finally:
        second.drop()
        first.reap(wait=True)
        os.close(out)


async def test_no_run_is_intended_before_what_starting_it_needs_is_written(tmp_path: Path) -> None:
    """A run's INTENT line says its start began; a process killed after it starts the run again from
    ``submitted.log``. So that line is written first, even when the driver starts a batch on its event loop while
    the submissions of that very tick still wait to write theirs (a run lost as "no record of the run and no
    launch" under ten SIGKILLs otherwise). A thread reads both files while 300 runs are submitted: each write lets
    go of the interpreter lock, so it reads them between the INTENT write and the next."""
    state = tmp_path / "home" / "backends" / "local"
    seen_early: set[str] = set()
    stop = threading.Event()

    def keys(path: Path, word: str | None) -> set[str]:
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return set()
        return {p[0] for line in lines if (p := line.split()) and (word is None or p[1:2] == [word])}

    def check() -> None:
        while not stop.is_set():
            intended = keys(state / "events.log", "INTENT")  # first: what is accepted is read after it
            seen_early.update(intended - keys(state / "submitted.log", None))

    checker = threading.Thread(target=check)
    async with Orchestrator(tmp_path / "home", config={"backends": {"local": {"max_running": 2}}}) as orch:
        checker.start()
        try:
            j = await orch.jobs.add(Job(name="t", application=Executable("/bin/true"),
                                        splitter=ArgSplitter([[] for _ in range(300)]), backend="local"))
            await j.submit()
            await j.wait(timeout=60)
        finally:
            stop.set()
            checker.join()
        assert j.status.value == "completed"
    assert not seen_early, sorted(seen_early)[:5]


async def test_a_launcher_killed_while_it_starts_a_program_never_starts_that_run_twice(tmp_path: Path) -> None:
    """The launcher writes a run's START line in the events file before its program exists, as a wrapper writes
    its own before its application starts. Killed while it starts the program, it leaves a run that may run:
    failed as lost (at the batch level: the run's log, written after the spawn, has no START), never taken for
    one that never began and started a second time (which CI once saw: a run that killed its own launcher, started
    twice). Deterministic: the second run's ``stdout`` is made a FIFO, so the launcher's spawn waits in the
    child's ``open`` of it until the test, having killed the launcher, reads it."""
    ran, pidfile = tmp_path / "ran", tmp_path / "launcher"
    first = (f"echo $PPID > {pidfile}; while [ ! -d ../../1/output ]; do sleep 0.05; done; "
             "mkfifo ../../1/output/stdout")
    config = {"backends": {"local": {"max_running": 1, "start_timeout": 1.0}}}
    async with Orchestrator(home=tmp_path / "home", config=config) as orch:
        j = await orch.jobs.add(Job(application=Executable("/bin/sh"), backend="local",
                                    splitter=ArgSplitter([["-c", first], ["-c", f"echo x >> {ran}"]]),
                                    retry=RetryPolicy(max_infrastructure=0)))
        await j.submit()
        with anyio.fail_after(20):
            while not pidfile.exists() or not pidfile.read_text().strip().isdigit():
                await anyio.sleep(0.02)
            launcher = int(pidfile.read_text())
            while not unexeced_children(launcher):  # the second run's spawn, held in its open of the FIFO
                await anyio.sleep(0.02)
        os.kill(launcher, signal.SIGKILL)
        reader = os.open(j.subjobs[1].outputdir / "stdout", os.O_RDONLY | os.O_NONBLOCK)  # the program runs now
        try:
            await j.wait(timeout=30)
            with anyio.fail_after(10):
                while not ran.exists():
                    await anyio.sleep(0.02)
            await anyio.sleep(1.5)  # past start_timeout: a second start would have come
        finally:
            os.close(reader)
        second = j.subjobs[1]
        assert second.status == "failed" and second.info.submit_counter == 1, second.info.history
        assert [(h["level"], h["action"]) for h in second.info.history] == [("batch", "failed")]  # its log: no START
        assert "without an END line" in (second.info.reason or "")
    assert ran.read_text() == "x\n"  # it ran once
