"""A job's postprocessors in a team service run as its owner, in processes of their own: what they may do to the
service (print without end, never end) reaches no other user's work."""

from __future__ import annotations

import pwd
import subprocess
import time
from pathlib import Path

import pytest
from served import Service, cli, cli_ok, start
from test_owner_local import TEAM, _needs_root, jobfile, ok, umask022
from test_service_owners import open_dir

__all__ = ["open_dir", "umask022"]  # fixtures, used by name


MERGER = '''\
import os


def merge(outputdir, subjobs):
    with open(os.path.join(str(outputdir), "merged.txt"), "w") as f:
        f.write(f"{os.getuid()} {os.getpid()}\\n")
'''


def merger_service(services: list[Service], open_dir: Path, monkeypatch: pytest.MonkeyPatch,
                   merger: str) -> tuple[Path, Path, Service]:
    """A team service whose users' functions are imported from ``modules`` (``teammerge.py`` holding ``merger``):
    the modules' dir, the home, the service."""
    _needs_root()
    modules = open_dir / "modules"
    modules.mkdir()
    modules.chmod(0o755)
    (modules / "teammerge.py").write_text(merger)
    (modules / "teammerge.py").chmod(0o644)
    monkeypatch.setenv("PYTHONPATH", str(modules))  # the service imports users' functions from there
    home = open_dir / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text(TEAM)
    return modules, home, start(services, home)


def test_a_custom_merger_runs_as_the_owner_in_a_process_of_its_own(services: list[Service], open_dir: Path,
                                                                   umask022: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    modules, home, service = merger_service(services, open_dir, monkeypatch, MERGER)
    job = jobfile(open_dir, "merged", "/bin/echo", ["x"],
                  '[splitter]\ntype = "args"\nargs = [["a"], ["b"]]\n'
                  '[merger]\ntype = "custom_merger"\nmerge = "teammerge:merge"\n')
    fqid = ok("bin", home, "submit", str(job)).strip()
    assert cli(home, "wait", fqid).returncode == 0, cli_ok(home, "show", fqid)
    uid, pid = (home / "workspace" / fqid / "output" / "merged.txt").read_text().split()
    assert int(uid) == pwd.getpwnam("bin").pw_uid
    assert int(pid) != service.pid

    # A merger that fails says why in the job's history, as it does in the service's process.
    (modules / "teammerge.py").write_text(MERGER + "\n\ndef broken(outputdir, subjobs):\n    raise ValueError('no')\n")
    job = jobfile(open_dir, "broken", "/bin/echo", ["x"],
                  '[splitter]\ntype = "args"\nargs = [["a"]]\n'
                  '[merger]\ntype = "custom_merger"\nmerge = "teammerge:broken"\n')
    fqid = ok("bin", home, "submit", str(job)).strip()
    assert cli(home, "wait", fqid).returncode == 1
    assert "ValueError: no" in cli_ok(home, "show", fqid)

    # The built-in TextMerger reads the runs' files as the owner too: the merged file is bin's.
    job = jobfile(open_dir, "texts", "/bin/echo", [],
                  '[splitter]\ntype = "args"\nargs = [["a"], ["b"]]\n[merger]\ntype = "text"\nfiles = ["stdout"]\n')
    fqid = ok("bin", home, "submit", str(job)).strip()
    assert cli(home, "wait", fqid).returncode == 0, cli_ok(home, "show", fqid)
    merged = home / "workspace" / fqid / "output" / "stdout"
    assert merged.read_text() == "a\nb\n" and merged.stat().st_uid == pwd.getpwnam("bin").pw_uid


LOUD = MERGER + '''
import stat

def pipes_but_stderr():
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            st = os.fstat(int(name))
        except OSError:
            continue
        if int(name) > 2 and stat.S_ISFIFO(st.st_mode) and st.st_ino != os.fstat(2).st_ino:
            found.append(int(name))
    return found


def loud(outputdir, subjobs):
    block = b"x" * (1 << 20)
    answer = pipes_but_stderr()  # as it may: the descriptor the answer goes to (the process's stdout, first)
    assert len(answer) == 1, answer
    for fd in (2, answer[0], 2):
        for _ in range(256):
            os.write(fd, block)
    merge(outputdir, subjobs)
'''


def peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def test_a_merger_that_prints_without_end_leaves_the_services_memory_bounded(
        services: list[Service], open_dir: Path, umask022: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner's process printed into pipes the service read whole: a merger writing gigabytes took the memory
    of a service that is everyone's. Only the last bytes are kept now; its answer, on its last line, stands."""
    _, home, service = merger_service(services, open_dir, monkeypatch, LOUD)
    job = jobfile(open_dir, "loud", "/bin/echo", ["x"], '[splitter]\ntype = "args"\nargs = [["a"]]\n'
                                                        '[merger]\ntype = "custom_merger"\nmerge = "teammerge:loud"\n')
    fqid = ok("bin", home, "submit", str(job)).strip()
    assert cli(home, "wait", fqid).returncode == 0, cli_ok(home, "show", fqid)
    assert (home / "workspace" / fqid / "output" / "merged.txt").read_text().split()[0] == str(
        pwd.getpwnam("bin").pw_uid)
    assert peak_mib(service.pid) < 400, "768 MiB printed, and read whole"


ASLEEP = MERGER + '''

def asleep(outputdir, subjobs):
    with open(os.path.join(str(outputdir), "asleep.pid"), "w") as f:
        f.write(str(os.getpid()))
    import time
    time.sleep(3600)
'''
#: Each user's mergers that sleep: more than the runtime's long-work slots (``work_limit``, 16), and, of the three
#: users, more than its process's worker threads (anyio's default: 40).
SLEEPERS = 15


def test_mergers_that_never_end_stop_no_one_elses_work(services: list[Service], open_dir: Path, umask022: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A merger run as its owner took one of the runtime's long-work slots (which every user's split needs) and
    was waited for in one of its worker threads (which start and read every user's runs). Sixteen that slept for
    ever took every slot, and no one's job was split again; forty, every thread. Each owner's postprocessing now
    takes that owner's own slots, its process waited for on the event loop; stopping the service kills them."""
    _, home, service = merger_service(services, open_dir, monkeypatch, ASLEEP)
    (home / "orchestrator.toml").write_text(TEAM.replace('"bin"]', '"bin", "daemon"]'))
    service.stop()
    service = start(services, home)
    job = jobfile(open_dir, "asleep", "/bin/true", [], '[splitter]\ntype = "args"\nargs = [["a"]]\n'
                                                     '[merger]\ntype = "custom_merger"\nmerge = "teammerge:asleep"\n')
    pidfiles: list[Path] = []
    try:
        for user in [name for name in ("bin", "daemon", "nobody") for _ in range(SLEEPERS)]:
            fqid = ok(user, home, "submit", str(job)).strip()
            pidfiles.append(home / "workspace" / fqid / "output" / "asleep.pid")
        deadline = time.monotonic() + 120
        while not all(f.exists() and f.read_text() for f in pidfiles):  # all 45 at once
            assert time.monotonic() < deadline, [f for f in pidfiles if not f.exists()]
            time.sleep(0.2)
        work = jobfile(open_dir, "work", "/bin/echo", [], '[splitter]\ntype = "args"\n'
                       f'args = {[[str(i)] for i in range(12)]!r}\n')
        fqid = ok("bin", home, "submit", str(work)).strip()
        assert cli(home, "wait", fqid, timeout=60).returncode == 0, cli_ok(home, "show", fqid)
        service.stop()
        time.sleep(0.5)
        alive = [f for f in pidfiles if Path(f"/proc/{f.read_text()}").exists()]
        assert not alive, f"{len(alive)} mergers outlived the service"
    finally:  # (those that outlived the service, or a failed test's)
        subprocess.run(["pkill", "-KILL", "-f", str(open_dir / "modules")], check=False)
