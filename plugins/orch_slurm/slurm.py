"""What the ``slurm`` driver says to Slurm and how it reads the answers; no state of its own.

Kept apart from the driver so that each parser is tested on Slurm's real
output without a cluster (``tests/integration/test_slurm_unit.py``), and so that the
way commands are run is one small seam: :class:`LocalRunner` runs them with
``anyio.run_process`` and an argument list (never a shell string); a runner
that sends the same argument lists over SSH can take its place later.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio

#: ``squeue`` output, one line per job or array task (``-r``): array job id, task id (``N/A`` for a plain job),
#: the job's own id (a task's unique id once it started), state, reason.
SQUEUE_FORMAT = "%F|%K|%A|%T|%r"
SACCT_FIELDS = "JobID,State,ExitCode"

#: Slurm job states, by what the driver reports for them.
QUEUED = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
ACTIVE = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"})
#: Ended by the batch system, not by the job: what the wrapper's log shows decides, else the backend aborted it.
ABORTED = {
    "TIMEOUT": "over its time limit",
    "NODE_FAIL": "its node failed",
    "OUT_OF_MEMORY": "out of memory",
    "BOOT_FAIL": "its node failed to boot",
    "DEADLINE": "past its deadline",
    "REVOKED": "revoked by a federated cluster",
}
FAILED = frozenset({"FAILED", "SPECIAL_EXIT"})
#: What Slurm says to a task, in its run's dir: without cgroups, a task killed for its memory ends FAILED, and
#: only this file tells why (``slurmstepd: error: Exceeded job memory limit``).
SLURM_OUT = "slurm.out"
OVER_MEMORY = ("Exceeded job memory limit", "exceeded memory limit", "oom-kill", "Out Of Memory")

#: scancel's per-job complaints that mean "nothing left to kill".
_GONE = ("already completing or completed", "invalid job id")
_SCANCEL_ERR = re.compile(r"error: .*?job id (\S+?):\s*(.*)$", re.IGNORECASE)


class SlurmError(RuntimeError):
    """A Slurm command could not be run, or failed as a whole; the message names it."""


class SlurmTimeout(SlurmError):
    """A command did not answer in time: whether it did anything is unknown."""


@dataclass(frozen=True, slots=True)
class Result:
    code: int
    out: str
    err: str


class Runner(Protocol):
    """Runs one Slurm command (an argument list) somewhere; ``env`` is the whole environment or ``None``."""

    async def __call__(self, argv: Sequence[str], *, stdin: bytes | None, env: Mapping[str, str] | None,
                      timeout: float) -> Result: ...


class LocalRunner:
    """On this machine, with ``anyio.run_process``: a missing command or a hang is a :class:`SlurmError`."""

    async def __call__(self, argv: Sequence[str], *, stdin: bytes | None, env: Mapping[str, str] | None,
                      timeout: float) -> Result:
        try:
            with anyio.fail_after(timeout):
                if stdin is None:  # never the orchestrator's own stdin
                    proc = await anyio.run_process(list(argv), stdin=subprocess.DEVNULL, env=env, check=False)
                else:
                    proc = await anyio.run_process(list(argv), input=stdin, env=env, check=False)
        except TimeoutError:
            raise SlurmTimeout(f"{argv[0]} did not answer within {timeout:.0f} s") from None
        except OSError as exc:
            raise SlurmError(f"cannot run {argv[0]}: {exc}") from None
        return Result(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))


@dataclass(frozen=True, slots=True)
class JobRef:
    """A backend id: ``"1234"`` (a plain job) or ``"1234_7"`` (task 7 of array 1234)."""

    job: str
    task: str | None = None

    @classmethod
    def parse(cls, backend_id: str) -> JobRef:
        job, sep, task = backend_id.partition("_")
        if not job.isdigit() or (sep and not task.isdigit()):
            raise ValueError(f"{backend_id!r} is not a Slurm job id (JOBID or JOBID_TASK)")
        return cls(job, task if sep else None)

    @property
    def key(self) -> str:
        return self.job if self.task is None else f"{self.job}_{self.task}"


@dataclass(frozen=True, slots=True)
class Row:
    """One job or array task as ``squeue`` or ``sacct -c`` tells it."""

    state: str
    reason: str = ""
    unique: str | None = None
    exit_code: int | None = None


def base_state(state: str) -> str:
    """``"CANCELLED by 0"`` (sacct), ``"COMPLETED+"`` → the bare state name."""
    words = state.split()
    return words[0].rstrip("+").upper() if words else ""


def parse_squeue(text: str) -> dict[str, Row]:
    """``squeue -h -r -o SQUEUE_FORMAT`` lines → backend id → row (malformed lines are skipped)."""
    rows: dict[str, Row] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        job, task, unique, state = parts[0], parts[1], parts[2], parts[3]
        reason = parts[4] if len(parts) > 4 else ""
        key = f"{job}_{task}" if task.isdigit() else job
        rows[key] = Row(base_state(state), reason, unique if unique.isdigit() else None)
    return rows


def parse_sacct(text: str) -> dict[str, Row]:
    """``sacct -c -n -P -o JobID,State,ExitCode`` lines → job id → row."""
    rows: dict[str, Row] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0]:
            continue
        code = parts[2].split(":")[0]
        rows[parts[0]] = Row(base_state(parts[1]), unique=parts[0],
                             exit_code=int(code) if code.isascii() and code.isdigit() else None)
    return rows


def parse_job_id(text: str) -> str:
    """``sbatch --parsable`` prints ``JOBID`` or ``JOBID;CLUSTER``."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    job = first.split(";")[0].strip()
    if not job.isdigit():
        raise SlurmError(f"sbatch answered no job id: {text.strip()[:200]!r}")
    return job


def parse_max_array_size(text: str) -> int | None:
    """``MaxArraySize`` from ``scontrol show config``."""
    m = re.search(r"^\s*MaxArraySize\s*=\s*(\d+)", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def parse_scancel_errors(text: str) -> dict[str, str]:
    """scancel's stderr → job id → complaint, leaving out those that mean the job is gone anyway."""
    errors: dict[str, str] = {}
    for line in text.splitlines():
        m = _SCANCEL_ERR.search(line)
        if m and not any(g in m.group(2).lower() for g in _GONE):
            errors[m.group(1)] = m.group(2).strip()
    return errors


def batch_script(shell: str, wrapper: Path, jobdirs: Sequence[Path], runfile: str, fence: str | None = None) -> str:
    """The script of one job array (or one job): the task id picks the run's dir, then the wrapper runs.

    Pure ``sh`` (a ``case``, no process): each run's own dir holds its run file
    and receives the wrapper's own output (``wrapper.out``); every path is
    quoted with :func:`shlex.quote`. With ``fence`` (a path prefix, see
    :mod:`orch_slurm.journal`), a task waits while ``FENCE.hold`` exists and
    ends without starting the wrapper if ``FENCE.void`` does.
    """
    q = shlex.quote
    lines = ["#!/bin/sh", f"# orchestrator: {len(jobdirs)} run(s); the array task id picks the run."]
    if fence is not None:
        lines += [f"f={q(fence)}", 'while [ -e "$f.hold" ]; do sleep 1; done',
                  'if [ -e "$f.void" ]; then echo "orchestrator: this submission was voided by a lookup" >&2; '
                  "exit 0; fi"]
    lines += ['case "${SLURM_ARRAY_TASK_ID:-0}" in']
    lines += [f"{i}) d={q(str(d))} ;;" for i, d in enumerate(jobdirs)]
    lines += ['*) echo "orchestrator: no run for array task ${SLURM_ARRAY_TASK_ID:-}" >&2; exit 97 ;;', "esac",
              f'exec {q(shell)} {q(str(wrapper))} "$d/{runfile}" > "$d/wrapper.out" 2>&1', ""]
    return "\n".join(lines)


def batch_key(keys: Sequence[str]) -> str:
    """A short, stable name for one ``sbatch`` of these runs' idempotency keys (its ``--comment``)."""
    if len(keys) == 1:
        return keys[0]
    digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]
    return f"orch-array-{digest}-{len(keys)}"
