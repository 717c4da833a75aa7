"""A ``local`` run as the driver holds it, and the starting of a batch of runs (in a thread, or on the loop)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from orchestrator.plugin import JobStatus, RunSpec, StatusUpdate
from orchestrator.plugin.contract import child_path
from orchestrator.plugin.processes import spawn_detached
from orchestrator.plugin.users import Identity, OwnerError, identity, read_inside, switch_argv
from orchestrator.plugin.wrapper import (
    BaseEnviron,
    SpawnError,
    application_entries,
    base_environ,
    env_entry,
    event_pid,
    make_run_dirs,
    make_usual_dirs,
    wrapper_argv,
    wrapper_env,
    wrapper_env_entries,
)

from .hosted import Launcher, start_frame
from .journal import Journal, Record
from .launcher import frame


@dataclass(slots=True, eq=False)
class Run:
    """A run this driver answers for, from its acceptance (or its adoption after a restart) to its end."""

    key: str
    fqid: str
    shell: str
    #: Its job dir (a string: a path object with its parts is some 200 bytes more a run, and runs wait by the
    #: hundred thousand); :attr:`jobdir` as a path.
    where: str
    record: Record
    #: What starting it needs; ``None`` once started (or while ``seed`` holds it, smaller).
    spec: RunSpec | None = None
    #: What starting it needs, for a run waiting its turn: :class:`Seed`.
    seed: Seed | None = None
    #: A run accepted by an earlier version of this driver, not yet started: its run file.
    runfile: Path | None = None
    pid: int | None = None
    launching: bool = False
    #: Counted against ``max_running``.
    occupies: bool = False
    #: Killed or forgotten: its end is not reported, and it is not started if it has not been.
    silent: bool = False
    #: Killed: if it was being started all the same, it is stopped at once.
    killed: bool = False
    ended: bool = False
    #: An INTENT without a process (a crash around the spawn): decided at this time.
    recheck_at: float | None = None
    #: Started by the home's launcher (:mod:`.hosted`), not by a wrapper of its own.
    hosted: bool = False
    #: Its log (``orch.<attempt>.log``), for a run followed after a restart: its program, if a launcher now gone
    #: started it, is known by it (the program's ``ORCH_JOBLOG``).
    joblog: str | None = None

    @property
    def jobdir(self) -> Path:
        return Path(self.where)

    @classmethod
    def waiting(cls, spec: RunSpec, record: Record, last: Seed | None) -> Run:
        """A run just accepted, to wait its turn: its spec kept as a :class:`Seed` (``last``: the one before)."""
        run = cls(spec.key, spec.fqid, str(spec.settings.get("shell", "/bin/sh")), str(spec.jobdir), record)
        run.seed = Seed.of(spec, last)
        if run.seed is None:
            run.spec = spec
        return run

    def start_spec(self) -> RunSpec | None:
        """What starting it needs (``None``: started, or accepted by an earlier version of the driver)."""
        if self.seed is not None:
            return self.seed.spec(self)
        return self.spec

    def owner(self) -> str | None:
        """Its owner, as it was accepted (``None``: the orchestrator's own user, or not known here)."""
        if self.seed is not None:
            return self.seed.template.owner
        return self.spec.owner if self.spec is not None else None

    def started(self) -> None:
        """It runs: what starting it needed is let go."""
        self.spec = self.seed = None


@dataclass(frozen=True, slots=True)
class Seed:
    """A waiting run's :class:`RunSpec`, small. A RunSpec holds four paths (some 1.5 KB a run with their parts and
    strings), and at 100,000 runs accepted at once that was most of the process's memory. What a run shares with
    the runs accepted beside it stays in one ``template`` (the spec of the first of them); the rest is its own,
    here and in its :class:`Run`; :meth:`spec` makes its RunSpec again when it starts."""

    template: RunSpec
    index: int
    attempt: int
    args: tuple[str, ...]
    retry_count: int
    retry_args: tuple[str, ...]

    @classmethod
    def of(cls, spec: RunSpec, last: Seed | None) -> Seed | None:
        """``spec`` as a seed (``last``'s template when it shares it); ``None`` when its directories are not the
        usual three in its job dir (kept whole then)."""
        jobdir = str(spec.jobdir)
        if (str(spec.outputdir) != jobdir + "/output" or str(spec.workdir) != jobdir + "/work"
                or str(spec.inputdir) != jobdir + "/input"):
            return None
        t = last.template if last is not None else None
        if (t is None or t.env is not spec.env or t.settings is not spec.settings or t.inputs is not spec.inputs
                or t.outputfiles is not spec.outputfiles or t.executable != spec.executable or t.mode != spec.mode
                or t.owner != spec.owner):
            t = spec
        return cls(t, spec.index, spec.attempt, spec.args, spec.retry_count, spec.retry_args)

    def spec(self, run: Run) -> RunSpec:
        t, jobdir = self.template, run.jobdir  # made whole, not by replace(): its fields looked up each time
        return RunSpec(fqid=run.fqid, index=self.index, attempt=self.attempt, key=run.key, executable=t.executable,
                       args=self.args, env=t.env, settings=t.settings, inputs=t.inputs, outputfiles=t.outputfiles,
                       jobdir=jobdir, inputdir=child_path(jobdir, "input"), outputdir=child_path(jobdir, "output"),
                       workdir=child_path(jobdir, "work"), mode=t.mode, retry_count=self.retry_count,
                       retry_args=self.retry_args, owner=t.owner)


#: The LOST line's reason of a run killed while it waited its turn: it ended killed, never having started.
NEVER_STARTED = "killed before it started"
#: The LOST line's reason of a killed run that ended without an END line (a killed wrapper writes none). Any other
#: LOST line of a run with a KILL line (a wrapper killed, then lost) is read as killed too.
KILLED_ON_REQUEST = "killed"


def ending_of(run: Run) -> StatusUpdate:
    """What the run's record says of its end (its wrapper's END line, or why it was lost)."""
    rec = run.record
    if rec.reason in (NEVER_STARTED, KILLED_ON_REQUEST) or (rec.reason is not None and rec.kill_by is not None):
        return StatusUpdate(run.fqid, JobStatus.KILLED, reason=rec.reason)
    if rec.reason is not None:
        return StatusUpdate(run.fqid, JobStatus.FAILED, reason=rec.reason)
    if rec.end_code == 0:
        return StatusUpdate(run.fqid, JobStatus.COMPLETED, exit_code=0)
    return StatusUpdate(run.fqid, JobStatus.FAILED, exit_code=rec.end_code, reason=f"exit code {rec.end_code}")


@dataclass(slots=True)
class Start:
    """What one start needs, handed to a worker thread (which touches nothing else of the driver)."""

    run: Run
    argv: list[str]
    #: By name, or encoded entries (:class:`BaseEnviron`).
    env: dict[str, str] | list[bytes]
    spec: RunSpec | None
    pid: int | None = None
    problem: str | None = None
    #: The owner to run as (``None``: the orchestrator's own user).
    owner: Identity | None = None
    #: Where the wrapper's own stdout and stderr go (``None``: the driver's ``wrapper.out``).
    out: int | None = None
    #: The launcher's start message, for a hosted run (its directories are made here; the launcher starts it).
    request: bytes | None = None
    #: The job dir of a hosted run started from its seed, without a spec: its usual directories are made from it.
    dirs: str | None = None


#: Most runs with wrappers of their own started on the event loop itself, without the hop to a worker thread.
INLINE_STARTS = 2


def owner_tag(run: Run) -> str:
    """The INTENT line's value: the run's owner (whose events file may tell of it), ``-`` for none."""
    owner = run.owner() if run.spec is not None or run.seed is not None else run.record.owner
    return owner if owner and " " not in owner else "-"


def starts_inline(batch: Sequence[Run]) -> bool:
    """Whether :func:`start_batch` starts ``batch`` on the event loop itself: a batch of first attempts the
    launcher starts (only their directories are made here), or a run or two run as the orchestrator's own user
    (no owner, or an owner who is that user: :func:`identity`). Why the launcher's batches: the hop to a thread
    and back cost more of the orchestrator's CPU than their ``mkdir`` calls hold the loop (``benchmarks/README.md``,
    issue 26). Not a retry's: emptying its output dir of the attempt before may take long."""
    if all(run.hosted and _attempt(run) == 1 for run in batch):
        return True
    if len(batch) > INLINE_STARTS:
        return False
    try:
        return all(identity(run.owner()) is None for run in batch)
    except OwnerError:  # told when it is started, in a thread like any other run of an owner
        return False


def _attempt(run: Run) -> int:
    """The attempt ``run`` starts (0: not known here, a run file's)."""
    if run.seed is not None:
        return run.seed.attempt
    return run.spec.attempt if run.spec is not None else 0


async def start_batch(starts: Sequence[Start], out: int, *, inline: bool) -> None:
    """:func:`start_all`, in a worker thread; ``inline`` (:func:`starts_inline`), on the event loop itself, where
    the start costs less than the hop to a thread would."""
    if inline:
        start_all(starts, out)
    else:
        await anyio.to_thread.run_sync(start_all, starts, out)


def start_all(starts: Sequence[Start], out: int) -> None:
    """Make each run's directories and start its wrapper (in a worker thread: ``mkdir`` and ``spawn_detached`` let
    go of the interpreter lock, so the event loop, and the other workers, go on meanwhile; on the loop itself when
    :func:`starts_inline`)."""
    for start in starts:
        if start.run.silent or start.problem is not None:  # killed meanwhile, or not to be started: not started
            continue
        try:
            if start.spec is not None:
                make_run_dirs(start.spec, owner=start.owner)
            elif start.dirs is not None:
                make_usual_dirs(start.dirs)
        except OSError as exc:
            start.problem = f"could not make the run's directories: {exc}"
            continue
        if start.request is not None:
            continue
        try:
            start.pid = spawn_detached(start.argv, start.env, out=out if start.out is None else start.out)
        except SpawnError as exc:
            start.problem = str(exc)


def starts_of(batch: Sequence[Run], wrapper: Path, *, journal: Journal, boot: int, environ: BaseEnviron,
              seeds: SeedFrames, launcher: Launcher | None = None) -> list[Start]:
    """Each run's command line and environment: ``sh wrapper.sh --env KEY COMMAND...`` (or, for a run accepted
    by an earlier version of the driver, ``sh wrapper.sh RUNFILE``). A run of another owner starts under
    ``setpriv`` with the owner's ids and environment, and notifies its owner's own events file. A run that
    is hosted (:attr:`Run.hosted`, decided when it took its slot) gets the ``launcher``'s message instead, its
    program and its environment as the wrapper would have started it (made by ``seeds``, the driver's own, for a
    run kept as a seed: a batch holds about one run, so what a template's runs share is kept from one to the next)."""
    bindir, notify = str(wrapper.parent), str(journal.events)
    base = environ.entries()
    out = []
    for run in batch:
        seed = run.seed
        # The usual run: no RunSpec made again for it. A hosted run is the orchestrator's own user's (its owner
        # named or not: :func:`.hosted.hostable`), so nothing of an owner is asked here.
        if launcher is not None and run.hosted and seed is not None and not seed.template.inputs:
            out.append(Start(run, [], {}, None, request=seeds.frame(run, seed, launcher.base_token(base)),
                             dirs=run.where))
            continue
        if (spec := run.start_spec()) is not None:
            try:
                who = identity(spec.owner)
            except OwnerError as exc:
                out.append(Start(run, [], {}, spec, problem=str(exc)))
                continue
            if who is None and run.hosted and launcher is not None:
                request = start_frame(spec, bindir, launcher.base_token(base),
                                      application_entries(spec, bindir=bindir, boot=boot))
                out.append(Start(run, [], {}, spec, request=request))
                continue
            if who is None:  # the single-user way, unchanged
                out.append(Start(run, wrapper_argv(run.shell, wrapper, spec),
                                 wrapper_env_entries(spec, base, bindir=bindir, notify=notify, boot=boot), spec))
                continue
            try:
                argv = [*switch_argv(who), *wrapper_argv(run.shell, wrapper, spec)]
                own = str(journal.owner_events(who.name, who.uid, who.gid))
                last_words = journal.owner_out(who.name, who.uid, who.gid)
            except (OwnerError, OSError) as exc:
                out.append(Start(run, [], {}, spec, problem=f"cannot run as owner {who.name}: {exc}"))
                continue
            env = wrapper_env(spec, who.env(base_environ()), bindir=bindir, notify=own, boot=boot)
            out.append(Start(run, argv, env, spec, owner=who, out=last_words))
        else:
            out.append(Start(run, [run.shell, str(wrapper), str(run.runfile)], dict(os.environ), None))
    return out


def logged_pid(run: Run) -> int | None:
    """The pid the last ``START`` line of a run followed after a restart gives in its log (``TIME START PID HOST``):
    a hosted run's program, which its launcher names there after the spawn, before the driver's LAUNCH line
    (none if no orchestrator ran). Read as any file a run wrote (:func:`read_inside`)."""
    if run.joblog is None:
        return None
    try:
        text = read_inside(Path(run.joblog), run.jobdir, most=1 << 16)
    except OSError:
        return None
    pids = [pid for line in text.splitlines() if len(p := line.split()) > 2 and p[1] == b"START"
            and (pid := event_pid(p[2].decode("ascii", "replace"))) is not None]  # (the run's to write)
    return pids[-1] if pids else None


class SeedFrames:
    """The launcher's start message for a hosted run kept as a :class:`Seed`, made from strings: what
    ``start_frame(spec, bindir, base, application_entries(spec, bindir=bindir, boot=boot))`` makes of its spec,
    without making that spec again (``tests/unit/test_waiting_runs.py`` holds the two equal, entry for entry). What
    the runs of one template share is encoded once. Why: remaking each run's spec, four path objects, and encoding
    its environment were the largest part of starting a run in the orchestrator's process
    (``benchmarks/README.md``, issue 26)."""

    def __init__(self, bindir: str, boot: int) -> None:
        self.bindir, self.boot = bindir, boot
        self._template: RunSpec | None = None
        self._shared: tuple[bytes, bytes, bytes, list[bytes], list[bytes]] = (b"", b"", b"", [], [])

    def frame(self, run: Run, seed: Seed, base: bytes) -> bytes:
        if seed.template is not self._template:
            t = self._template = seed.template
            self._shared = (os.fsencode(t.executable), env_entry("ORCH_MODE", t.mode),
                            env_entry("ORCH_BOOT", str(self.boot) if self.boot else ""),
                            [env_entry(k, v) for k, v in t.env.items()],
                            [env_entry("ORCH_LOG", f"{self.bindir}/orch-log"),
                             env_entry("ORCH_STATE", f"{self.bindir}/orch-state")])
        exe, mode, boot, env, tail = self._shared
        attempt, outdir, workdir = str(seed.attempt), run.where + "/output", run.where + "/work"
        argv = [exe, *(os.fsencode(a) for a in seed.args)]
        return frame(b"S", run.key.encode(), attempt.encode(), os.fsencode(outdir), os.fsencode(workdir),
                     os.fsencode(self.bindir), base, str(len(argv)).encode(), *argv,
                     env_entry("ORCH_FQID", run.fqid), env_entry("ORCH_HOME", workdir), mode,
                     env_entry("ORCH_RETRY_COUNT", str(seed.retry_count)), env_entry("ORCH_ATTEMPT", attempt), boot,
                     *(env_entry(f"ORCH_RETRY_ARG_{i}", arg) for i, arg in enumerate(seed.retry_args, 1)),
                     *env, env_entry("ORCH_JOBLOG", f"{outdir}/orch.{attempt}.log"), *tail)
