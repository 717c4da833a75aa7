"""A team service its own users cannot break (issue 22, items 1, 2, 6, 11): work runs as its owner.

A real ``orchestrator serve`` as root, ``[service] users = ["nobody", "bin"]``, ``nobody`` the victim and
``bin`` the attacker; the command line run as those users with ``runuser`` (see ``test_service_owners``).
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import signal
import stat
import subprocess
import sysconfig
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from served import ORCH, Service, cli, cli_ok, start
from test_service_owners import _python_for, _user, as_user, open_dir

__all__ = ["open_dir"]  # a fixture, used by name

TEAM = '[core]\npoll_interval = 0.05\n[service]\nusers = ["nobody", "bin"]\n'


def _needs_root() -> None:
    if os.geteuid() != 0 or shutil.which("runuser") is None or shutil.which("setpriv") is None:
        pytest.skip("needs root, runuser and setpriv: work runs as other OS users")
    for name in ("nobody", "bin", "daemon"):
        _user(name)


@pytest.fixture
def umask022() -> Iterator[None]:
    """The service inherits umask 022 (what a careless start script leaves): its own umask must win."""
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture
def team(services: list[Service], open_dir: Path, umask022: None) -> Service:
    _needs_root()
    home = open_dir / "home"
    home.mkdir()
    home.chmod(0o755)
    (home / "orchestrator.toml").write_text(TEAM)
    return start(services, home, "--tcp-port", "0")  # TCP: the home's token file exists


def refused_start(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run a service that must refuse to start; one that starts all the same is stopped (its process group)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the service started: {out}\n{err}") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def jobfile(where: Path, name: str, exe: str, args: list[str], extra: str = "") -> Path:
    path = where / f"{name}.toml"
    path.write_text(f'name = "{name}"\n{extra}[application]\nexe = "{exe}"\nargs = {list(args)!r}\n'.replace("'", '"')
                    + '[backend]\nname = "local"\n[retry]\nmax_early = 0\nmax_late_handled = 0\n'
                      'max_late_unhandled = 0\n')
    path.chmod(0o644)
    return path


def script(where: Path, name: str, body: str) -> Path:
    path = where / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def ok(user: str, home: Path, *args: str) -> str:
    done = as_user(user, home, *args)
    assert done.returncode == 0, (user, args, done.stdout, done.stderr)
    return done.stdout


def wait_status(home: Path, fqid: str, wanted: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = cli_ok(home, "show", fqid)
        if ["status", wanted] in [line.split()[:2] for line in shown.splitlines()]:
            return
        time.sleep(0.1)
    raise AssertionError(f"job {fqid} not {wanted} within {timeout} s:\n{cli_ok(home, 'show', fqid)}")


def test_a_local_job_runs_as_its_owner_and_cannot_act_as_the_service(team: Service, open_dir: Path,
                                                                      services: list[Service]) -> None:
    home = team.home
    bin_uid = pwd.getpwnam("bin").pw_uid
    assert team.token  # there is one to steal
    victim = ok("nobody", home, "submit", str(jobfile(open_dir, "victim", "/bin/sleep", ["60"]))).strip()
    wait_status(home, victim, "running")
    cli_cmd = " ".join(shlex.quote(a) for a in [*_python_for("bin"), "--home", str(home)])
    attack = script(open_dir, "attack.sh", f"""\
        id -u
        id -u > owner.txt
        cat {shlex.quote(str(home / "service" / "token"))} && echo TOKEN-READ
        cat {shlex.quote(str(home / "repository.sqlite"))} > /dev/null && echo REPOSITORY-READ
        {cli_cmd} kill {victim}
        echo "kill exit $?"
        """)
    mine = ok("bin", home, "submit", str(jobfile(open_dir, "attack", str(attack), [], 'outputfiles = ["owner.txt"]\n'))
              ).strip()
    assert cli(home, "wait", mine).returncode == 0
    out = ok("bin", home, "peek", mine)
    err = ok("bin", home, "peek", mine, "stderr")
    assert out.splitlines()[0] == str(bin_uid), out  # the application ran with bin's uid
    assert "TOKEN-READ" not in out and "REPOSITORY-READ" not in out, out
    assert "Permission denied" in err, err
    # Its own socket connection is bin's: refused on nobody's job (403 "not owner"), nobody's job untouched.
    assert "kill exit 2" in out, (out, err)
    assert f"job {victim} belongs to nobody; you are bin" in err, err
    assert (home / "workspace" / mine / "output" / "owner.txt").stat().st_uid == bin_uid  # the wrapper's files too
    assert ok("bin", home, "peek", mine, "owner.txt").strip() == str(bin_uid)

    # A run started by the previous service process is found again after a restart, and root kills it.
    team.terminate()
    restarted = start(services, home, "--tcp-port", "0")
    assert restarted.pid != team.pid
    wait_status(home, victim, "running")
    cli_ok(home, "kill", victim)
    wait_status(home, victim, "killed")


def test_what_the_service_reads_of_a_run_never_follows_its_links(team: Service, open_dir: Path) -> None:
    """A run that makes its stderr and its log links to the service's token: the service, which reads them (the
    reason of a failure quotes stderr's last lines), never reads the token for it; peek refuses the links."""
    home = team.home
    token = home / "service" / "token"
    linker = script(open_dir, "linker.sh", f"""\
        out=$(dirname "$PWD")/output
        rm -f "$out/stderr" && ln -s {shlex.quote(str(token))} "$out/stderr"
        ln -s {shlex.quote(str(token))} "$out/leak"
        exit 3
        """)
    fqid = ok("bin", home, "submit", str(jobfile(open_dir, "linker", str(linker), []))).strip()
    assert cli(home, "wait", fqid).returncode == 1
    shown = cli_ok(home, "show", fqid)
    assert "exit code 3" in shown or "exit 3" in shown, shown
    assert team.token not in shown and team.token not in team.output()
    for name in ("stderr", "leak"):
        refused = as_user("bin", home, "peek", fqid, name)
        assert refused.returncode == 2 and team.token not in refused.stdout, (name, refused.stdout)
        assert "out of the job's directory" in refused.stderr, refused.stderr


def test_a_run_that_swaps_its_output_dir_for_a_link_harms_nothing_outside(team: Service, open_dir: Path) -> None:
    """The next attempt empties the run's output dir: as its owner, so a link to a directory of root's that the
    run left in its place leads to nothing the service deletes or reads."""
    home = team.home
    precious = open_dir / "precious"
    precious.mkdir()
    precious.chmod(0o755)
    (precious / "keep.txt").write_text("root's\n")
    (precious / "stderr").write_text("root's stderr, not for bin\n")
    swapper = script(open_dir, "swapper.sh", f"""\
        out=$(dirname "$PWD")/output
        mv "$out" "$out.old" && ln -s {shlex.quote(str(precious))} "$out"
        exit 1
        """)
    fqid = ok("bin", home, "submit", str(jobfile(open_dir, "swapper", str(swapper), []))).strip()
    assert cli(home, "wait", fqid).returncode == 1
    ok("bin", home, "resubmit", fqid)
    assert cli(home, "wait", fqid).returncode == 1
    assert sorted(p.name for p in precious.iterdir()) == ["keep.txt", "stderr"]
    assert "not for bin" not in cli_ok(home, "show", fqid)


def test_a_checkpointed_job_of_another_owner_saves_its_states(team: Service, open_dir: Path) -> None:
    """The starting state the service writes into a run's work dir is the owner's: the run saves into it."""
    home = team.home
    program = open_dir / "checkpointed.py"
    program.write_text(textwrap.dedent(f"""\
        import anyio
        from orchestrator import Executable, Job, Orchestrator

        async def main():
            async with Orchestrator(home={str(home)!r}) as orch:
                job = await orch.jobs.add(Job(name="cp", backend="local", steps="1..2", application=Executable(
                    "/bin/sh", args=["-c", "$ORCH_STATE next-step && $ORCH_STATE save-value answer 42 && "
                                           "$ORCH_STATE save"])))
                await job.submit()
                await job.wait(timeout=60)
                print(job.fqid, job.status.value)

        anyio.run(main)
        """))
    program.chmod(0o644)
    boot = f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r}); exec(open({str(program)!r}).read())"
    done = subprocess.run(["runuser", "-u", "bin", "--", _python_for("bin")[0], "-S", "-c", boot],
                          capture_output=True, text=True, timeout=120, cwd=open_dir)
    assert done.returncode == 0, done.stderr
    fqid, status = done.stdout.split()
    assert status == "completed", ok("bin", home, "show", fqid)
    saved = ok("bin", home, "checkpoint", "get", fqid)
    assert "answer" in saved and "42" in saved, saved


def test_an_input_file_the_owner_cannot_read_is_refused(team: Service, open_dir: Path) -> None:
    home = team.home
    secret = open_dir / "secret.txt"
    secret.write_text("only root reads this\n")
    secret.chmod(0o600)
    for path in (home / "service" / "token", secret):
        job = jobfile(open_dir, "steal", "/bin/cat", [path.name], f'inputfiles = ["{path}"]\n')
        refused = as_user("bin", home, "submit", str(job))
        assert refused.returncode == 2, (refused.stdout, refused.stderr)
        assert "inputfiles" in refused.stderr and "cannot be read by its owner bin" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    # One bin may read is copied in as bin's, and the run reads it.
    mine = open_dir / "mine.txt"
    mine.write_text("bin's data\n")
    mine.chmod(0o644)
    fqid = ok("bin", home, "submit", str(jobfile(open_dir, "reads", "/bin/cat", ["mine.txt"],
                                                 f'inputfiles = ["{mine}"]\n'))).strip()
    assert cli(home, "wait", fqid).returncode == 0
    assert ok("bin", home, "peek", fqid) == "bin's data\n"
    copied = home / "workspace" / fqid / "input" / "mine.txt"
    assert copied.stat().st_uid == pwd.getpwnam("bin").pw_uid


def test_nothing_of_a_job_or_of_the_service_is_readable_by_another_user(team: Service, open_dir: Path) -> None:
    home = team.home
    writer = script(open_dir, "writer.sh", """\
        echo private > result.txt
        echo "out of nobody"
        """)
    job = jobfile(open_dir, "private", str(writer), [], 'outputfiles = ["result.txt"]\n'
                                                          '[splitter]\ntype = "args"\nargs = [["a"], ["b"]]\n')
    fqid = ok("nobody", home, "submit", str(job)).strip()
    assert cli(home, "wait", fqid).returncode == 0
    jobdir = home / "workspace" / fqid
    files = [Path(d) / f for d, _, names in os.walk(jobdir) for f in names]
    assert any(f.name == "result.txt" for f in files) and any(f.name == "stdout" for f in files)
    nobody = pwd.getpwnam("nobody").pw_uid
    for path in files:
        assert path.stat().st_uid == nobody, path
        read = subprocess.run(["runuser", "-u", "bin", "--", "cat", str(path)], capture_output=True, timeout=30)
        assert read.returncode != 0 and b"private" not in read.stdout, path
    for d, _, _ in os.walk(jobdir):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700 and os.stat(d).st_uid == nobody, d
    assert stat.S_IMODE((home / "workspace").stat().st_mode) == 0o711  # crossed by every owner, listed by none
    # The service's own files: its alone, whatever umask it was started with.
    for path in [home / "repository.sqlite", *(home / "backends" / "local").iterdir()]:
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    own = home / "backends" / "local" / "events.nobody.log"
    assert own.stat().st_uid == nobody  # the wrappers' ending records: nobody's own file, 0600
    assert (home / "backends" / "local" / "wrapper.nobody.out").stat().st_uid == nobody  # its wrappers' last words
    assert (home / "backends" / "local" / "submitted.log").stat().st_uid == 0
    # All bin may read in the home, of what it may find: the wrapper's scripts.
    walked = subprocess.run(["runuser", "-u", "bin", "--", "find", str(home), "-type", "f", "-readable"],
                            capture_output=True, text=True, timeout=30)
    readable = {Path(p).relative_to(home).parts[0] for p in walked.stdout.split()}
    assert readable == {"bin"}, walked.stdout


def test_a_multi_user_service_refuses_to_start_without_root(open_dir: Path) -> None:
    _needs_root()
    home = open_dir / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text(TEAM)
    shutil.chown(home, "daemon", "daemon")
    refused = refused_start(["runuser", "-u", "daemon", "--", *_python_for("daemon"), "--home", str(home), "serve"])
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    said = refused.stderr.strip()
    assert len(said.splitlines()) == 1 and "must run as root" in said and "nobody" in said, said
    assert "Traceback" not in said
    assert not (home / "repository.sqlite").exists()


def test_users_that_are_not_os_users_are_refused_at_start(open_dir: Path) -> None:
    _needs_root()
    home = open_dir / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text('[service]\nusers = ["nobody", "no-such-user-22"]\n')
    refused = refused_start([str(ORCH), "--home", str(home), "serve"])
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "no-such-user-22" in refused.stderr and "not users of this system" in refused.stderr


def test_what_a_run_writes_in_its_owners_events_file_cannot_stop_the_service(team: Service, open_dir: Path,
                                                                             services: list[Service]) -> None:
    """An owner's runs write their START and END lines in a file of the owner's (``events.<owner>.log``), where the
    owner may write anything. A number Python's ``isdigit`` takes and ``int`` refuses (a superscript two, ``--5``)
    raised where the service read the line, and again in the next service process, which reads the file from its
    start: no ``local`` run went on, anyone's. Now such a line says nothing, and the run is judged by the rest."""
    home = team.home
    events = home / "backends" / "local" / "events.bin.log"
    forger = script(open_dir, "forger.sh", f"""\
        key=$(awk '$2 == "START" {{ k = $1 }} END {{ print k }}' {events})
        printf '%s START \\302\\262 1.0\\n%s END --5 1.0\\n' "$key" "$key" >> {events}
        echo "forged $key"
        """)
    mine = ok("bin", home, "submit", str(jobfile(open_dir, "forger", str(forger), []))).strip()
    cli(home, "wait", mine)
    victim = as_user("nobody", home, "submit", str(jobfile(open_dir, "after", "/bin/true", [])))
    assert victim.returncode == 0, (victim.stderr, team.output())
    assert cli(home, "wait", victim.stdout.strip()).returncode == 0, team.output()
    assert team.proc is not None and team.proc.poll() is None, team.output()
    assert "forged orch-" in ok("bin", home, "peek", mine)  # its lines were written
    team.terminate()
    start(services, home, "--tcp-port", "0")  # reads the owner's file again, from its start
    again = ok("nobody", home, "submit", str(jobfile(open_dir, "again", "/bin/true", []))).strip()
    assert cli(home, "wait", again).returncode == 0, cli_ok(home, "show", again)


def test_a_cpu_record_a_run_forges_cannot_stop_the_service(team: Service, open_dir: Path) -> None:
    """A run's ``orch.usage`` is in its output dir, its owner's: the run may write records of its own there before
    the wrapper appends its own. The service reads them when the run ends, for ``orchestrator_cpu_seconds_total``.
    A negative CPU time (``-1m0.0s``) reached Prometheus' counter, which refuses it by raising: the service
    stopped. An infinite one made the counter infinite for good. Such a record is now skipped, as a torn one is."""
    home = team.home
    headers = {"Authorization": f"Bearer {team.token}"}
    for n, cpu in enumerate(["-1m0.0s", "infm0.0s"]):
        forger = script(open_dir, f"usage{n}.sh", f"""\
            out=$(dirname "$PWD")/output
            printf '1 0 0 0 1 0\\n{cpu} 0m0.0s\\n0m0.0s 0m0.0s\\n' >> "$out/orch.usage"
            """)
        mine = ok("bin", home, "submit", str(jobfile(open_dir, f"usage{n}", str(forger), []))).strip()
        assert cli(home, "wait", mine).returncode == 0
        time.sleep(1.0)  # the records are read off the loop, shortly after the run ends
        assert team.proc is not None and team.proc.poll() is None, team.output()
        try:
            scraped = httpx.get(f"{team.url}/metrics", headers=headers).text
        except httpx.HTTPError as exc:
            raise AssertionError(f"the service is gone: {team.output()}") from exc
        counted = [line for line in scraped.splitlines() if line.startswith("orchestrator_cpu_seconds_total")]
        assert all(0 <= float(line.split()[-1]) < 1e6 for line in counted), counted
    victim = as_user("nobody", home, "submit", str(jobfile(open_dir, "after", "/bin/true", [])))
    assert victim.returncode == 0, (victim.stderr, team.output())
    assert cli(home, "wait", victim.stdout.strip()).returncode == 0, team.output()


def test_states_a_run_forges_cannot_stop_the_services_writes(team: Service, open_dir: Path) -> None:
    """A run's saved states are its own files (``work/.orch-state``), read by the service when the run ends and
    stored in its repository. A state with time ``nan`` (stored as NULL: refused) or a ``current`` of 10**21 (no
    64-bit integer) was put back in the writer's queue at each flush, so nothing of anyone was written from then
    on, and the next submission that needed a write stopped the service. Such a state is now stored with the time
    it was read, and such a ``current`` says nothing."""
    home = team.home
    for n, (current, time_line) in enumerate([("1", "nan"), (str(10**21), "1.0")]):
        forger = script(open_dir, f"state{n}.sh", f"""\
            mkdir -p .orch-state
            printf 'orch-state\\t1\\ntime\\t{time_line}\\n' > .orch-state/{current}.state
            echo {current} > .orch-state/current
            """)
        mine = ok("bin", home, "submit", str(jobfile(open_dir, f"state{n}", str(forger), []))).strip()
        assert cli(home, "wait", mine).returncode == 0
        victim = as_user("nobody", home, "submit", str(jobfile(open_dir, f"after{n}", "/bin/true", [])))
        assert victim.returncode == 0, (victim.stderr, team.output())
        assert cli(home, "wait", victim.stdout.strip()).returncode == 0, team.output()
        assert team.proc is not None and team.proc.poll() is None, team.output()
