"""The remote side of the ``ssh`` backend: POSIX ``sh`` scripts, built here and nowhere else.

Every script is fed to ``sh -s`` on the remote host, so a host needs
nothing but a POSIX shell, ``setsid`` and ``tail``. Every path, key and
value that reaches a script goes through :func:`shlex.quote`; nothing is
interpolated unquoted except integers we produced ourselves.

Remote layout, under ``<workdir>/<namespace>`` (one namespace per home)::

    bin-<hash>/wrapper.sh, orch-log   the job wrapper, immutable once installed
    events.log                        append-only: INTENT, LAUNCH, START, END, CANCEL lines
    input/<hash>/<name>               input files, staged once per host
    runs/<key>/run.env                one directory per run (the key is unique per attempt)
    runs/<key>/work, output           the wrapper's ORCH_HOME and ORCH_OUTDIR
    runs/<key>/launched               the launch guard: created with O_EXCL by the one
                                      command that starts the run (or cancels it)
    runs/<key>/pid                    the wrapper's PID (= its process group and session)
    runs/<key>/launched/fence.<token> a lookup's fence (a directory where the guard would be): no
                                      submission from before the lookup can prepare or start the run

Why the guard is a file created under ``set -C`` (noclobber: ``O_EXCL``):
it is atomic, costs no process, and makes starting a run idempotent. It is
created by ``true > guard``, not ``: > guard``: ``:`` is a special built-in,
and a redirection error on one makes a POSIX shell (dash) exit the script. A
command repeated after a dropped connection, or an orchestrator restarted
in the middle of a launch, can never start the same run twice. Each
prepare or launch step is one ``if ...; fi`` line, so a script cut short
by a dropped connection runs whole steps or none (a truncated line is a
syntax error, never half a step).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

q = shlex.quote
#: Separates the monitor script's report lines from the raw events bytes that follow.
EVENTS_MARK = "@@orch-events@@"
#: Most directories per ``mkdir -p`` call (stays far below ARG_MAX).
_MKDIR_CHUNK = 400


def run_dir(key: str) -> str:
    """A run's directory, relative to the namespace base."""
    return f"runs/{key}"


@dataclass(frozen=True, slots=True)
class Prep:
    """One run to prepare remotely: its key, its run file's text, the staged inputs to link."""

    key: str
    runfile: str
    links: tuple[str, ...] = field(default_factory=tuple)


def _head(base: str) -> str:
    return f"set -C\ncd {q(base)} || exit 90\n"


def setup(base: str, bindir: str, names: Sequence[str]) -> str:
    """Make the namespace; report whether the wrapper's files ``names`` are installed, setsid is there,
    and the boot time (the wrapper's clock)."""
    have = " && ".join(f"[ -f {q(bindir + '/' + n)} ]" for n in names) or "false"
    return (
        "umask 022\n"
        f"mkdir -p {q(base)}/runs {q(base)}/input || exit 90\n"
        f"cd {q(base)} || exit 90\n"
        ": >> events.log || exit 90\n"
        "command -v setsid >/dev/null 2>&1 || echo NOSETSID\n"
        f"if {have}; then echo HAVEBIN; fi\n"
        "if [ -r /proc/stat ]; then while read -r k v; do "
        'if [ "$k" = btime ]; then echo "BOOT $v"; fi; done < /proc/stat; fi\n'
        "echo READY\n"
    )


def _launch_line(key: str, bindir: str, base: str, ts: str) -> str:
    d = q(run_dir(key))
    k = q(key)
    return (
        f"if {{ true > {d}/launched; }} 2>/dev/null; then echo {k} INTENT - {ts} >> events.log; "
        f"setsid sh {q(bindir + '/wrapper.sh')} {q(f'{base}/{run_dir(key)}/run.env')} "
        f"</dev/null >|{d}/wrapper.out 2>&1 & echo \"$!\" >| {d}/pid; "
        f"echo {k} LAUNCH \"$!\" {ts} >> events.log; echo L {k} \"$!\"; else echo D {k}; fi\n"
    )


def submit(base: str, bindir: str, preps: Sequence[Prep], launch: Iterable[str], ts: float,
           lifts: Iterable[tuple[str, str]] = ()) -> str:
    """Prepare runs (directories, run files, input links) and start those in ``launch``.

    ``lifts`` are ``(key, token)`` of fences this driver's own lookup put up
    (see :func:`lookup`): each is taken down first, by its token, so that
    this submission (and only one that knows the token) may go ahead.
    Reports ``P key`` per run prepared now, ``L key pid`` per run started
    now, ``D key`` per run whose guard already existed (started before, or
    cancelled), and ``OK`` at the end.
    """
    out = [_head(base)]
    dirs = [f"{run_dir(p.key)}/{sub}" for p in preps for sub in ("work", "output")]
    for i in range(0, len(dirs), _MKDIR_CHUNK):
        out.append("mkdir -p " + " ".join(q(d) for d in dirs[i:i + _MKDIR_CHUNK]) + " || exit 91\n")
    for key, token in lifts:
        guard = f"{run_dir(key)}/launched"
        out.append(f"rm {q(f'{guard}/fence.{token}')} 2>/dev/null && rmdir {q(guard)} 2>/dev/null\n")
    for p in preps:
        d = q(run_dir(p.key))
        link = f" && ln -sf -- {' '.join(q(s) for s in p.links)} {d}/work/" if p.links else ""
        out.append(f"if [ ! -e {d}/launched ]; then printf '%s' {q(p.runfile)} >| {d}/run.env{link} "
                   f"&& echo P {q(p.key)}; fi\n")
    stamp = f"{ts:.3f}"
    out += [_launch_line(k, bindir, base, stamp) for k in launch]
    out.append("echo OK\n")
    return "".join(out)


#: The lookup of one key (``$1``) under a token (``$2``): ``L`` (its guard is taken: started or cancelled
#: here), ``P`` (prepared here, not started: whoever starts it takes the guard, once), ``N`` (not here, and
#: fenced under the token), ``E`` (could not fence). The fence is a *directory* where the guard file goes,
#: so ``true > guard`` (launch, kill) and ``[ ! -e guard ]`` (prepare) fail on it; it holds one file,
#: ``fence.<token>``, renamed to each new lookup's token (a rename is atomic), and only a submission
#: that names the current token can take it down (:func:`submit`).
_LOOK = r"""look() {
  d="runs/$1"; g="$d/launched"
  if [ -f "$g" ]; then echo "L $1"; return; fi
  if [ -f "$d/run.env" ] && [ ! -e "$g" ]; then echo "P $1"; return; fi
  mkdir -p "$d" 2>/dev/null || { echo "E $1"; return; }
  for n in 1 2 3 4 5; do
    mkdir "$g" 2>/dev/null
    if [ -d "$g" ]; then
      for t in "$g"/fence.*; do
        if [ -e "$t" ] && [ "$t" != "$g/fence.$2" ]; then mv -f "$t" "$g/fence.$2" 2>/dev/null; fi
      done
      if [ ! -e "$g/fence.$2" ]; then { true > "$g/fence.$2"; } 2>/dev/null; fi
      if [ -f "$g/fence.$2" ]; then echo "N $1"; return; fi
    elif [ -f "$g" ]; then echo "L $1"; return
    fi
  done
  echo "E $1"
}
"""


def lookup(base: str, keys: Iterable[str], token: str) -> str:
    """Where each run stands on this host, after a restart; a run not here is fenced under ``token``.

    Checked in this order so no answer goes stale: a taken guard (it started,
    or was cancelled) can never be undone; a prepared run (run file, no
    guard) is found, and starts at most once whoever starts it; any other
    run gets the fence *before* the answer ``N``, so a submission from before
    the restart, maybe still under way on the host, can no longer prepare or
    start it. A fence left by an earlier lookup is taken over (its token
    renamed), since that lookup's process is gone. Ends with ``OK``.
    """
    tok = q(token)
    return _head(base) + _LOOK + "".join(f"look {q(k)} {tok}\n" for k in keys) + "echo OK\n"


def launch(base: str, bindir: str, keys: Iterable[str], ts: float) -> str:
    """Start runs prepared earlier (they waited for a free slot); same report lines as :func:`submit`."""
    stamp = f"{ts:.3f}"
    return _head(base) + "".join(_launch_line(k, bindir, base, stamp) for k in keys) + "echo OK\n"


def monitor(base: str, pids: Iterable[int], unverified: Iterable[str], offset: int) -> str:
    """One tick's look at a host: which PIDs live, where unverified runs stand, new events.

    Liveness is checked *before* the events file is read, so a wrapper
    found dead has already written its END line, if it ever will.
    """
    out = [f"cd {q(base)} || exit 90\n"]
    pid_words = " ".join(str(int(p)) for p in pids)
    if pid_words:
        out.append(f'for p in {pid_words}; do kill -0 "$p" 2>/dev/null && echo "A $p"; done\n')
    key_words = " ".join(q(k) for k in unverified)
    if key_words:
        out.append(f'for k in {key_words}; do if [ -e "runs/$k/launched" ]; then echo "K $k launched"; '
                   f'elif [ -f "runs/$k/run.env" ]; then echo "K $k prepared"; else echo "K $k absent"; fi; done\n')
    out.append(f"echo {q(EVENTS_MARK)}\n")
    out.append(f"exec tail -c +{int(offset) + 1} events.log\n")
    return "".join(out)


def kill(base: str, targets: Iterable[tuple[str, int | None]], grace: float, ts: float) -> str:
    """Stop runs: cancel those not started (take their guard), signal the process group of the others.

    SIGTERM now, SIGKILL after ``grace`` seconds from a detached subshell
    (stdio on /dev/null, so the SSH channel closes at once). Reports
    ``C key`` (cancelled before it started), ``T key`` (signalled) or
    ``U key`` (started, but no PID to signal yet).
    """
    stamp = f"{ts:.3f}"
    g = f"{max(grace, 0.0):.2f}"
    out = [_head(base)]
    for key, pid in targets:
        d = q(run_dir(key))
        k = q(key)
        known = str(int(pid)) if pid else ""
        out.append(
            f"if {{ true > {d}/launched; }} 2>/dev/null; then echo {k} CANCEL - {stamp} >> events.log; echo C {k}; "
            f"else p={known}; if [ -z \"$p\" ] && [ -f {d}/pid ]; then read -r p < {d}/pid; fi; "
            f"if [ -n \"$p\" ]; then kill -TERM -\"$p\" 2>/dev/null; "
            f"(sleep {g}; kill -KILL -\"$p\" 2>/dev/null) </dev/null >/dev/null 2>&1 & echo T {k}; "
            f"else echo U {k}; fi; fi\n")
    out.append("echo OK\n")
    return "".join(out)
