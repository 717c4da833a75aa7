"""Without a service, the read-only commands read a home another process holds (SQLite's WAL lets them);
a command that would write is refused, saying how to share a home."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.runtime.homelock import READER_WAIT

EXE = str(Path(sys.executable).with_name("orchestrator"))
ENV = {**os.environ, "COLUMNS": "200"}


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, "--home", str(home), *args], capture_output=True, text=True, timeout=60, env=ENV)


def test_jobs_show_and_peek_answer_while_another_process_holds_the_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    jobfile = tmp_path / "big.toml"
    values = ", ".join(f'["{i}"]' for i in range(1000))
    jobfile.write_text(f'name = "big"\n[application]\nexe = "/bin/echo"\n[backend]\nname = "sim"\n'
                       f'run_seconds = 0.5\nqueued = {{ 999 = 20 }}\n[splitter]\ntype = "args"\nargs = [{values}]\n')
    holder = subprocess.Popen([EXE, "--home", str(home), "submit", str(jobfile), "--wait"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        deadline = time.monotonic() + 60
        listing: dict[str, object] = {}
        while time.monotonic() < deadline:  # until the holder has split and stored the job
            done = cli(home, "jobs", "--json")
            if done.returncode == 0:
                listing = json.loads(done.stdout)
                if listing["jobs"] and listing["jobs"][0]["subjobs"] == 1000:  # type: ignore[index]
                    break
            time.sleep(0.2)
        assert listing["jobs"][0]["subjobs"] == 1000, listing  # type: ignore[index]
        time.sleep(1.5)  # the holder's writer has flushed what ran meanwhile

        started = time.monotonic()
        done = cli(home, "jobs")
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        # it reads the home as the holder last wrote it, never waiting for it (a waiter would wait READER_WAIT,
        # 30 s): a bound far from both, since how fast a loaded host starts a process is no promise
        assert took < READER_WAIT / 3, f"orchestrator jobs took {took:.2f} s while another process holds the home"
        assert "big" in done.stdout and "1000" in done.stdout
        shown = json.loads(cli(home, "show", "0", "--status", "completed", "--json").stdout)
        assert shown["counts"]["completed"] >= 1 and shown["subjob_rows"]
        assert cli(home, "peek", "0.0").returncode in (0, 2)  # sim runs write no files: said, not a traceback
        assert holder.poll() is None  # it still holds the home

        refused = cli(home, "kill", "0")
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert "is in use by" in refused.stderr and f"orchestrator --home {home} serve" in refused.stderr
    finally:
        holder.terminate()
        holder.wait(timeout=30)


def test_a_command_that_writes_waits_for_a_reading_command_to_let_go(tmp_path: Path) -> None:
    """``orchestrator jobs`` on a home nobody holds takes its lock for a moment; a ``submit`` that starts
    then waits for it instead of failing (it did fail, about one time in five, in the test above)."""
    import anyio

    from orchestrator import Orchestrator
    from orchestrator.runtime.homelock import READER_ROLE

    home = tmp_path / "home"
    jobfile = tmp_path / "small.toml"
    jobfile.write_text('name = "small"\n[application]\nexe = "/bin/true"\n[backend]\nname = "sim"\n'
                       'run_seconds = 0\n')

    async def hold_while_a_writer_starts() -> subprocess.Popen[str]:
        async with Orchestrator(home, role=READER_ROLE):
            writer = subprocess.Popen([EXE, "--home", str(home), "submit", str(jobfile), "--wait"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
            await anyio.sleep(1.5)  # the writer is started and finds the home held
            assert writer.poll() is None, writer.communicate()
        return writer

    writer = anyio.run(hold_while_a_writer_starts)
    out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert "completed" in out


def test_a_waiting_writer_takes_the_home_as_the_reader_lets_go_however_long_it_waited(tmp_path: Path) -> None:
    """A reader lets go of the home by emptying the lock file, then closing it. A writer that had waited for it a
    second already, and looked in that instant, found the held lock naming no one and gave up ("in use by
    another process"): once in a CI run of the test above. An empty file is a lock being taken or let go, and the
    writer waits it out."""
    import fcntl
    import socket
    import threading
    import time

    from orchestrator.core.errors import HomeLockedError
    from orchestrator.runtime.homelock import READER_ROLE, HomeLock

    path = tmp_path / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, f"{READER_ROLE}, pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    got: list[str] = []

    def take() -> None:
        writer = HomeLock(path, "a writer")
        try:
            writer.acquire()
            got.append("taken")
            writer.release()
        except HomeLockedError as exc:
            got.append(str(exc))

    thread = threading.Thread(target=take)
    thread.start()
    time.sleep(1.5)  # the writer waits for the reader
    os.ftruncate(fd, 0)  # the reader lets go: its file emptied, then (a slow instant later) closed
    time.sleep(0.3)
    os.close(fd)
    thread.join(timeout=10)
    assert got == ["taken"]
