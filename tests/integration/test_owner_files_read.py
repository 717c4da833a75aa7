"""What the service reads of a user's files never holds it for everyone: a FIFO is never read, a log of
gigabytes is read to its last MiB, an events file its owner filled is skipped.

A FIFO where the orchestrator reads a user's file blocks its reader until someone opens it to write, and the
reader was the service's: as the owner, a worker thread and one of the runtime's long-work slots for as long as
the command's timeout (a minute), once per file, as often as the owner asked; in the orchestrator's own process
(a run of its own user's, or ``show`` of anyone's run), its event loop, for good. Each is refused at once now, as
not a regular file."""

from __future__ import annotations

import os
import pwd
import subprocess
import sysconfig
import textwrap
import time
from pathlib import Path

import anyio
import pytest
from served import ORCH, Service, cli, cli_ok
from test_owner_local import jobfile, ok, open_dir, script, team, umask022
from test_service_owners import _python_for, as_user

from orchestrator import Executable, Job, Orchestrator

pytestmark = pytest.mark.anyio
__all__ = ["open_dir", "team", "umask022"]  # fixtures, used by name

#: A run that makes a FIFO in its work dir, then waits for the file named by its argument.
MAKES_A_FIFO = 'mkfifo pipe && while [ ! -e "$1" ]; do sleep 0.05; done'


def peek_in_time(argv: list[str]) -> subprocess.CompletedProcess[str]:
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    assert time.monotonic() - t0 < 15
    return done


async def test_peek_refuses_a_fifo_a_run_of_ones_own_made(tmp_path: Path) -> None:
    home, go = tmp_path / "home", tmp_path / "go"
    async with Orchestrator(home=home) as orch:
        j = await orch.jobs.add(Job(name="fifo", application=Executable("/bin/sh", args=["-c", MAKES_A_FIFO, "sh",
                                                                                          str(go)]),
                                    backend="local"))
        await j.submit()
        try:
            with anyio.fail_after(20):  # (running as the repository holds it: what another process reads)
                while not ((j.workspace / "work" / "pipe").exists() and "running" in subprocess.run(
                        [str(ORCH), "--home", str(home), "show", j.fqid], capture_output=True, text=True).stdout):
                    await anyio.sleep(0.1)
            done = peek_in_time([str(ORCH), "--home", str(home), "peek", j.fqid, "pipe"])
            assert done.returncode == 2 and "pipe is not a regular file" in done.stderr, done
        finally:  # (the run ends, whatever became of the test)
            go.touch()
        await j.wait(timeout=20)
        assert j.status == "completed"


def test_the_team_service_refuses_an_owners_fifo_at_once(team: Service, open_dir: Path) -> None:
    home = team.home
    bin_user = pwd.getpwnam("bin")
    fifo = open_dir / "fifo"
    os.mkfifo(fifo)
    os.chown(fifo, bin_user.pw_uid, bin_user.pw_gid)
    program = open_dir / "given.py"  # through the API: the CLI's job file reader refuses it before the service
    program.write_text(textwrap.dedent(f"""\
        import anyio
        from orchestrator import Executable, Job, JobError, Orchestrator

        async def main():
            async with Orchestrator(home={str(home)!r}) as orch:
                job = await orch.jobs.add(Job(name="given", backend="local", application=Executable("/bin/true"),
                                              inputfiles=[{str(fifo)!r}]))
                try:
                    await job.submit()
                except JobError as exc:
                    print(exc)

        anyio.run(main)
        """))
    program.chmod(0o644)
    boot = f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r}); exec(open({str(program)!r}).read())"
    t0 = time.monotonic()
    done = subprocess.run(["runuser", "-u", "bin", "--", _python_for("bin")[0], "-S", "-c", boot],
                          capture_output=True, text=True, timeout=120, cwd=open_dir)
    assert time.monotonic() - t0 < 15, "the service read the FIFO until its reader's timeout"
    assert "not a regular file" in done.stdout and "inputfiles" in done.stdout, (done.stdout, done.stderr)

    go = open_dir / "go"
    maker = script(open_dir, "maker.sh", MAKES_A_FIFO + "\n")
    fqid = ok("bin", home, "submit", str(jobfile(open_dir, "maker", str(maker), [str(go)]))).strip()
    try:
        deadline = time.monotonic() + 30
        while "running" not in cli_ok(home, "show", fqid) or not (home / "workspace" / fqid / "work" / "pipe").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        done = as_user("bin", home, "peek", fqid, "pipe")
        assert done.returncode == 2 and "pipe is not a regular file" in done.stderr, done
    finally:  # (the run ends, whatever became of the test)
        go.touch()
    assert cli(home, "wait", fqid).returncode == 0


def test_show_of_a_run_whose_owner_made_its_log_a_fifo_answers(team: Service, open_dir: Path) -> None:
    """``show`` reads a run's log for its host and exit code. It was read as root, on the service's event loop,
    following links, whole: a FIFO in its place hung the service for every user (SIGTERM too) until someone wrote
    into it. It is read now as any file a run wrote: a FIFO is no log."""
    home = team.home
    fqid = ok("bin", home, "submit", str(jobfile(open_dir, "plain", "/bin/echo", ["hi"]))).strip()
    assert cli(home, "wait", fqid).returncode == 0
    output = home / "workspace" / fqid / "output"
    swap = subprocess.run(["runuser", "-u", "bin", "--", "sh", "-c", 'rm -f orch*.log && mkfifo orch.log'],
                          cwd=output, capture_output=True, text=True, timeout=30)
    assert swap.returncode == 0, swap.stderr
    t0 = time.monotonic()
    shown = cli(home, "show", fqid, timeout=20)
    assert shown.returncode == 0 and "completed" in shown.stdout, shown
    assert time.monotonic() - t0 < 15
    assert cli(home, "jobs", timeout=20).returncode == 0


def test_an_events_file_its_owner_made_huge_is_not_read_on(team: Service, open_dir: Path) -> None:
    """``local`` reads each owner's events file (their wrappers' START and END lines) on the service's event
    loop, to its end: made a sparse file of 20 GiB, it held the loop for some 40 s, every user's work with it.
    What it gained past what its runs write is skipped now."""
    home = team.home
    first = ok("bin", home, "submit", str(jobfile(open_dir, "first", "/bin/true", []))).strip()
    assert cli(home, "wait", first).returncode == 0
    events = home / "backends" / "local" / "events.bin.log"
    grow = subprocess.run(["runuser", "-u", "bin", "--", "truncate", "-s", "20G", str(events)],
                          capture_output=True, text=True, timeout=30)
    assert grow.returncode == 0, grow.stderr
    t0 = time.monotonic()
    later = ok("bin", home, "submit", str(jobfile(open_dir, "later", "/bin/true", []))).strip()
    assert cli(home, "wait", later, timeout=60).returncode == 0
    assert time.monotonic() - t0 < 15, "the events file was read to its end"
    assert "grew past what its runs write" in team.output()


async def test_a_run_that_fills_its_log_is_judged_by_its_first_and_last_lines(tmp_path: Path) -> None:
    """Of a log over a MiB, its first 64 KiB (START) and its last MiB (the ending's lines) are read: a run that
    wrote three MiB of lines to it ends as its END line says, its reason none, its keywords a thousand at most."""
    fill = ("awk 'BEGIN { for (i = 0; i < 40000; i++) printf \"1.00 INFO %s %d\\n\", "
            "\"padding-padding-padding-padding-padding-padding-padding-padding\", i }' >> \"$ORCH_JOBLOG\"")
    async with Orchestrator(home=tmp_path / "home") as orch:
        j = await orch.jobs.add(Job(name="filler", application=Executable("/bin/sh", args=["-c", fill]),
                                    backend="local"))
        await j.submit()
        await j.wait(timeout=60)
        assert (j.status.value, j.info.reason) == ("completed", None)
        assert (j.outputdir / "orch.log").stat().st_size > 3_000_000
        shown = subprocess.run([str(ORCH), "--home", str(tmp_path / "home"), "show", j.fqid], capture_output=True,
                               text=True, timeout=60)
        assert shown.returncode == 0 and "completed" in shown.stdout, shown
