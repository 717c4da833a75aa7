"""What the runtime and ``local`` hold for runs that wait: a worker per slot, not a task per run, and a waiting run's
spec kept small and made whole again when it starts."""

from __future__ import annotations

import os
import pwd
from dataclasses import fields
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from orch_local.hosted import Launcher, hostable, start_frame
from orch_local.journal import Journal, Record
from orch_local.runs import Run, Seed, SeedFrames, starts_of

from orchestrator.plugin import RunSpec
from orchestrator.plugin.wrapper import BaseEnviron, application_entries
from orchestrator.runtime import bulk

#: Runs of one batch share their settings object (as the runtime makes them).
SETTINGS = {"shell": "/bin/sh"}


def run_spec(jobdir: Path, i: int, *, env: dict[str, str], owner: str | None = None,
             outputdir: Path | None = None) -> RunSpec:
    return RunSpec(fqid=f"3.{i}", index=i, attempt=2, key=f"orch-h-3.{i}-2", executable="/bin/echo",
                   args=(f"a{i}",), env=env, settings=SETTINGS, inputs=(), outputfiles=("*.txt",),
                   jobdir=jobdir, inputdir=jobdir / "input", outputdir=outputdir or jobdir / "output",
                   workdir=jobdir / "work", mode="test", retry_count=1, retry_args=("--again",), owner=owner)


def waiting(spec: RunSpec, last: Seed | None) -> tuple[Run, Seed | None]:
    run = Run.waiting(spec, Record(), last)
    return run, run.seed


def test_a_waiting_run_starts_with_the_spec_it_was_accepted_with(tmp_path: Path) -> None:
    env = {"A": "1"}
    specs = [run_spec(tmp_path / "3" / str(i), i, env=env) for i in range(3)]
    last = None
    runs = []
    for spec in specs:
        run, last = waiting(spec, last)
        runs.append(run)
    for run, spec in zip(runs, specs, strict=True):
        assert run.start_spec() == spec
        assert run.owner() is None
    # the three share one template: what they have alike is held once
    assert runs[0].seed is not None and runs[2].seed is not None
    assert runs[2].seed.template is runs[0].seed.template


def test_a_new_runspec_field_is_caught_until_seeds_carry_it() -> None:
    """``Seed.spec`` names every field of the RunSpec it makes again (not ``replace``: slower): a field added to
    RunSpec must be added there, and to ``run_spec`` above, where each has a value other than its default."""
    assert [f.name for f in fields(RunSpec)] == [
        "fqid", "index", "attempt", "key", "executable", "args", "env", "settings", "inputs", "outputfiles", "jobdir",
        "inputdir", "outputdir", "workdir", "mode", "retry_count", "retry_args", "owner"]


def test_runs_that_differ_in_what_they_share_get_their_own_template(tmp_path: Path) -> None:
    first, last = waiting(run_spec(tmp_path / "0", 0, env={"A": "1"}), None)
    other, _ = waiting(run_spec(tmp_path / "1", 1, env={"A": "1"}, owner="orch-alice"), last)  # another owner
    assert first.seed is not None and other.seed is not None
    assert other.seed.template is not first.seed.template
    assert other.owner() == "orch-alice"
    assert other.start_spec() == run_spec(tmp_path / "1", 1, env={"A": "1"}, owner="orch-alice")


def test_a_spec_with_unusual_directories_is_kept_whole(tmp_path: Path) -> None:
    spec = run_spec(tmp_path / "0", 0, env={}, outputdir=tmp_path / "elsewhere")
    assert Seed.of(spec, None) is None
    run, _ = waiting(spec, None)
    assert run.spec is spec and run.start_spec() is spec


def test_a_started_run_lets_its_spec_go(tmp_path: Path) -> None:
    run, _ = waiting(run_spec(tmp_path / "0", 0, env={}), None)
    run.started()
    assert run.start_spec() is None


@pytest.mark.parametrize("concurrency", [1, 3, 50])
def test_bulk_calls_go_in_order_at_most_concurrency_at_once(concurrency: int) -> None:
    at_once, most, begun = 0, 0, []

    async def call(item: int) -> int:
        nonlocal at_once, most
        begun.append(item)
        at_once += 1
        most = max(most, at_once)
        await anyio.sleep(0.001 * (item % 3))
        at_once -= 1
        return item * 10

    async def main() -> list[int | None]:
        return await bulk.each(list(range(20)), call, stop=None, concurrency=concurrency)

    assert anyio.run(main) == [i * 10 for i in range(20)]
    assert begun == list(range(20))
    assert most == min(concurrency, 20)


_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=12)
_NAMES = st.one_of(st.sampled_from(["ORCH_FQID", "ORCH_HOME", "ORCH_JOBLOG", "ORCH_MODE", "PATH", "HOME"]),
                   st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True))


@settings(max_examples=60, deadline=None)
@given(env=st.dictionaries(_NAMES, _TEXT, max_size=4), args=st.lists(_TEXT, max_size=3),
       retry_args=st.lists(_TEXT, max_size=2), attempt=st.integers(1, 12), boot=st.sampled_from([0, 1764460800]),
       mode=st.sampled_from(["production", "test"]), index=st.integers(0, 99_999))
def test_a_seed_start_message_is_the_one_its_spec_would_make(env: dict[str, str], args: list[str],
                                                             retry_args: list[str], attempt: int, boot: int,
                                                             mode: str, index: int) -> None:
    """``SeedFrames`` makes a hosted run's start message from its seed's strings. It must be, byte for byte, what
    ``start_frame`` makes of the run's spec with ``application_entries``: the wrapper's environment rules live
    there, and a rule changed there without here fails this test."""
    jobdir = Path("/home/u/.orch/jobs/7") / str(index)
    first = RunSpec(fqid="7.0", index=0, attempt=1, key="orch-h-7.0-1", executable="/bin/echo", args=(), env=env,
                    settings=SETTINGS, inputs=(), outputfiles=(), jobdir=Path("/home/u/.orch/jobs/7/0"),
                    inputdir=Path("/home/u/.orch/jobs/7/0/input"), outputdir=Path("/home/u/.orch/jobs/7/0/output"),
                    workdir=Path("/home/u/.orch/jobs/7/0/work"), mode=mode)
    spec = RunSpec(fqid=f"7.{index}", index=index, attempt=attempt, key=f"orch-h-7.{index}-{attempt}",
                   executable="/bin/echo", args=tuple(args), env=env, settings=SETTINGS, inputs=(), outputfiles=(),
                   jobdir=jobdir, inputdir=jobdir / "input", outputdir=jobdir / "output", workdir=jobdir / "work",
                   mode=mode, retry_count=attempt - 1, retry_args=tuple(retry_args))
    _, last = waiting(first, None)
    run, seed = waiting(spec, last)
    assert seed is not None and seed.template is first  # made from the template of the run before it
    bindir = "/home/u/.orch/bin"
    other_spec = run_spec(Path("/home/u/.orch/jobs/8/0"), 0, env={"OTHER": "x"})
    other, other_seed = waiting(other_spec, None)
    assert other_seed is not None
    made = SeedFrames(bindir, boot)
    for r, sd, sp in ((other, other_seed, other_spec), (run, seed, spec), (other, other_seed, other_spec)):
        assert made.frame(r, sd, b"9.1") == start_frame(sp, bindir, b"9.1",  # templates in turn: each its own
                                                        application_entries(sp, bindir=bindir, boot=boot))


def test_a_hosted_run_owned_by_the_orchestrators_own_user_starts_from_its_seed(tmp_path: Path) -> None:
    """The API names every job's owner (its caller: in the embedded API, this process's user). A hosted run so owned
    starts from its seed's strings (``SeedFrames``), its RunSpec never made again. Until this test, only a run with
    no owner named did, and the API names one for every job: the path made for the usual run was never taken."""
    me = pwd.getpwuid(os.getuid()).pw_name
    jobdir = tmp_path / "7" / "0"
    spec = RunSpec(fqid="7.0", index=0, attempt=1, key="orch-h-7.0-1", executable="/bin/true", args=("x",),
                   env={"A": "1"}, settings={}, inputs=(), outputfiles=(), jobdir=jobdir, inputdir=jobdir / "input",
                   outputdir=jobdir / "output", workdir=jobdir / "work", mode="test", owner=me)
    run, seed = waiting(spec, None)
    assert seed is not None
    assert hostable(spec)  # the driver hosts it (a launcher there): its owner is this process's user
    run.hosted = True
    statedir, bindir = tmp_path / "state", tmp_path / "bin"
    statedir.mkdir()
    journal = Journal(statedir)
    try:
        launcher, environ = Launcher(statedir, journal.events, 1), BaseEnviron()
        [start] = starts_of([run], bindir / "wrapper.sh", journal=journal, boot=0, environ=environ,
                            seeds=SeedFrames(str(bindir), 0), launcher=launcher)
        token = launcher.base_token(environ.entries())
    finally:
        journal.close()
    assert start.problem is None
    assert start.spec is None and start.dirs == str(jobdir)  # from the seed: no RunSpec, the usual dirs by name
    assert start.request == start_frame(spec, str(bindir), token, application_entries(spec, bindir=str(bindir), boot=0))
