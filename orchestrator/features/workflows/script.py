"""What runs on the worker, and what the runner does to files: package scripts, acquisition, disposal.

A package runs as ``/bin/sh <home>/workflows/<id>/packages/<key>/run.sh``
through the ordinary job wrapper. The script enters the workflow's shared
data directory, where producers leave their outputs and consumers find their
inputs, brings in the inputs that have a locator (a link or a copy, on the
worker, not in the orchestrator's loop), and runs the binaries in sequence. After each binary it checks the
exit code, stops if the binary wrote ``RETRY``, ``HOLD`` or ``FAILED`` through
``$ORCH_LOG`` (the orchestrator's retry policy decides what happens next), checks
that the declared outputs exist (else exit 3: "missing output"), and leaves a
marker ``<k>.done``. A restart of the package skips every binary whose marker
is there and whose outputs still exist: it resumes at the first unfinished
binary (DØ's "intelligent restart" inside the chaining script).

Every value in the script is quoted with :func:`shlex.quote`. The script
needs nothing from the orchestrator but ``$ORCH_LOG`` and ``$ORCH_JOBLOG``,
and runs without them (as under HTCondor, from a DAGMan export).
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from .model import FileSpec, Package

#: Exit codes of the script itself (a binary's own non-zero code is passed on).
EXIT_NO_DATADIR, EXIT_MISSING_INPUT, EXIT_MISSING_OUTPUT = 96, 4, 3

_PRELUDE = """\
orch_log() { if [ -n "${ORCH_LOG:-}" ]; then "$ORCH_LOG" "$@"; fi; }
# A binary that said RETRY, HOLD or FAILED ends the package: the orchestrator decides.
orch_stopped() { [ -n "${ORCH_JOBLOG:-}" ] && grep -Eq '^[^ ]+ (RETRY|HOLD|FAILED) ' "$ORCH_JOBLOG"; }
"""


def _q(value: str) -> str:
    return shlex.quote(value)


def package_script(pkg: Package, key: str, *, workflow: str, datadir: Path, markdir: Path,
                   dropped: Iterable[str] = (), external: Mapping[str, FileSpec] | None = None) -> str:
    """The shell script of one package; inputs in ``dropped`` are neither checked nor listed.

    ``external``: inputs nobody produces, with their locator and acquisition
    (:attr:`.dag.Dag.external`); the script brings those with a locator into the
    data dir itself, on the worker, before the binary that needs them.
    """
    gone = set(dropped)
    external = external or {}
    out = ["#!/bin/sh",
           f"# Package {key} of workflow {workflow}, written by orchestrator: its binaries in sequence,",
           "# in the workflow's data dir; a restart resumes at the first binary without a marker.",
           f"DATA={_q(str(datadir))}", f"MARKS={_q(str(markdir))}", _PRELUDE.rstrip("\n"),
           'mkdir -p "$MARKS" && cd "$DATA" || { orch_log INFO "cannot enter the data dir $DATA"; '
           f"exit {EXIT_NO_DATADIR}; }}"]
    for k, b in enumerate(pkg.binaries, 1):
        label = f"binary {k}" + (f" ({b.name})" if b.name else "")
        inputs = [f.name for f in b.inputs if f.name not in gone]
        outputs = [f.name for f in b.outputs]
        have_outputs = "".join(f" && [ -e {_q(n)} ]" for n in outputs)
        env = [f"ORCH_INPUTS={_q(' '.join(inputs))}", f"ORCH_OUTPUTS={_q(' '.join(outputs))}", f"ORCH_BINARY={k}",
               *(f"{name}={_q(value)}" for name, value in b.env.items())]
        command = " ".join(_q(w) for w in (b.executable, *b.args))
        out += ["", f"# {label}",
                f'if [ -f "$MARKS/{k}.done" ]{have_outputs}; then',
                f"    orch_log INFO {_q(f'{label}: finished in an earlier attempt, skipped')}",
                "else"]
        for name in inputs:
            spec = external.get(name)
            if spec is not None and spec.locator is not None and spec.acquisition != "prefetch":
                out.append(f"    {_acquire_line(spec)}")
        if inputs:
            out.append(f"    for f in {' '.join(_q(n) for n in inputs)}; do [ -e \"$f\" ] || "
                       f"{{ orch_log INFO {_q(label + ': input')} \"$f\" is missing; exit {EXIT_MISSING_INPUT}; }}; "
                       "done")
        out += [f"    {' '.join(env)} {command} </dev/null",
                "    rc=$?",
                f"    if [ \"$rc\" -ne 0 ]; then orch_log INFO {_q(label)} ended with exit code \"$rc\"; "
                "exit \"$rc\"; fi",
                "    if orch_stopped; then exit 0; fi"]
        if outputs:
            out.append(f"    for f in {' '.join(_q(n) for n in outputs)}; do [ -e \"$f\" ] || "
                       f"{{ orch_log INFO {_q(label + ': output')} \"$f\" is missing; exit {EXIT_MISSING_OUTPUT}; }}; "
                       "done")
        out += [f'    : > "$MARKS/{k}.done"', "fi"]
    out.append("exit 0")
    return "\n".join(out) + "\n"


def _acquire_line(spec: FileSpec) -> str:
    """``none``: a link to the locator; ``copy``: a copy under a temporary name, renamed (consumers never
    see half a file). Nothing when the file is there already."""
    assert spec.locator is not None
    name, loc = _q(spec.name), _q(spec.locator)
    if spec.acquisition == "none":
        return f"[ -e {name} ] || ln -s {loc} {name} 2>/dev/null || [ -e {name} ]"
    tmp = _q(f".orch-acquire-{spec.name}") + '."$$"'
    return (f"[ -e {name} ] || {{ cp {loc} {tmp} && mv -f {tmp} {name}; }} || "
            f"{{ rm -f {tmp}; orch_log INFO {_q('cannot copy ' + spec.locator)}; exit {EXIT_MISSING_INPUT}; }}")


def write_script(path: Path, text: str) -> None:
    """Write atomically: a run that starts meanwhile reads the old script or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(0o755)
    tmp.replace(path)


def clear_markers(markdir: Path) -> None:
    """A package's first start: no marker of an earlier workflow with the same id may skip a binary."""
    if markdir.is_dir():
        for entry in markdir.glob("*.done"):
            entry.unlink()


def acquire(spec: FileSpec, datadir: Path) -> bool:
    """Bring an input with a locator into the data dir now (``prefetch``, at submission); ``False``
    when it already was there. A copy is written under a temporary name and renamed."""
    assert spec.locator is not None
    target = datadir / spec.name
    if target.exists() or target.is_symlink():
        return False
    source = Path(spec.locator)
    if spec.acquisition == "none":
        target.symlink_to(source)
        return True
    tmp = datadir / f".orch-acquire-{spec.name}"
    shutil.copy2(source, tmp)
    tmp.replace(target)
    return True


def dispose(datadir: Path, name: str) -> bool:
    """Delete a file of the data dir (a link to a locator loses the link, never the original)."""
    path = datadir / name
    if path.is_symlink() or path.is_file():
        path.unlink()
        return True
    return False


def data_size(datadir: Path) -> int:
    """Bytes of the regular files under ``datadir`` (links to locators cost the cache nothing)."""
    total = 0
    for root, _dirs, files in os.walk(datadir):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total
