"""Checkpoint mechanics (DataGrid): the state each run starts from, and the states runs save.

Every backend that runs the wrapper runs the job in its working directory
(``RunSpec.workdir``, the job's ``$ORCH_HOME``), where the State API
(:mod:`orchestrator.checkpoint`, ``$ORCH_STATE``) keeps ``.orch-state/``.

- Before a run starts, the state it starts from is written there: the
  initial state (the job's steps, nothing done), the newest saved one
  (``resume``: retries and releases), or one the user handed in (``given``,
  ``resubmit --from-state``). A new starting state is stored, and the run's
  checkpoint record updated through the ``SubmitOutcomes`` the actor posts.
- While a run goes on, and when it ends (before it is judged), the states
  it saved since the last look are read into the repository, which keeps the
  newest ``states_kept`` of each job; the newest reaches the state machine
  with the run's report.

Which state a run starts from, and whether a failed run resumes, are the
state machine's decisions (``SendSubmit.start``, :mod:`orchestrator.core.retry`).
Only jobs with ``steps``, or that saved a state, are concerned; a subjob has
steps only when its master has (``StepSplitter`` partitions them), so the
master's definition answers for all its subjobs without reading theirs.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from ..checkpoint import STATE_DIR, State, StateError, Steps, initial_text, relabel, write_state_dir
from ..core.errors import ConfigError
from ..core.ids import parse_fqid
from ..core.machine import StateMachine
from ..plugin.contract import RunSpec
from ..plugin.users import Identity, OwnerError, fs_as, identity, read_inside
from .definitions import Definitions
from .repository import Repository, StateRow
from .writer import Writer

#: Past the largest sequence number a state may have (the repositories keep it as a 32-bit integer): a run writes
#: its own ``current``, and one the repository refused stopped every write after it.
MAX_SEQ = 2**31
#: What a state file may hold besides its state, at most (its header lines: label, time, steps...).
STATE_SLACK = 64 << 10
_SETTINGS = {"states_kept": 1, "max_state_size": 1, "max_restarts_per_state": 0, "default_partitions": 1}


@dataclass(frozen=True, slots=True)
class CheckpointSettings:
    """The ``[checkpoint]`` settings, checked: read by the definitions and the writer before the runs start."""

    keep: int
    max_size: int
    max_restarts: int
    default_partitions: int

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> CheckpointSettings:
        for key, least in _SETTINGS.items():
            value = settings.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(f"checkpoint.{key} must be an integer >= {least}, not {value!r}")
        return cls(settings["states_kept"], settings["max_state_size"], settings["max_restarts_per_state"],
                   settings["default_partitions"])

    def env(self) -> dict[str, str]:
        """What the State API on the worker needs to know (exported through the run file)."""
        return {"ORCH_STATE_MAX": str(self.max_size), "ORCH_STATE_KEEP": str(self.keep)}


class Checkpoints:
    """The states runs start from and save; a run's checkpoint record is the state machine's, its definition the
    definitions', and each state read is stored by the writer with the next flush."""

    def __init__(self, settings: CheckpointSettings, repo: Repository, sm: StateMachine, definitions: Definitions,
                 writer: Writer, log: Any) -> None:
        self.keep = settings.keep
        self.max_size = settings.max_size
        self.repo = repo
        self.sm = sm
        self.definitions = definitions
        self.writer = writer
        #: Each run's state pointer (``current``) as last looked at: its mtime (a run that saved nothing since is
        #: passed over with one ``stat``).
        self._looked: dict[str, int] = {}
        #: Each looked-at run's state pointer path, as a string (an idle service stats a thousand of them every few
        #: seconds: joining paths cost more than the ``stat``). Both are forgotten when the run ends.
        self._pointers: dict[str, str] = {}
        self.log = log

    def record(self, fqid: str) -> Mapping[str, Any]:
        """A run's checkpoint record in the state machine (``seq``, ``label``, ``final``, ``time``)."""
        return self.sm.checkpoint(parse_fqid(fqid))

    def spec_of(self, fqid: str) -> Mapping[str, Any]:
        """A run's definition (its steps)."""
        fq = parse_fqid(fqid)
        return self.definitions.spec(fq[0]) if len(fq) == 1 else self.definitions.subjob_spec(fq[0], fq[1])

    def store(self, row: StateRow) -> None:
        self.writer.add_state(row)

    def concerned(self, fqid: str) -> bool:
        master = fqid.partition(".")[0]
        return self.spec_of(master).get("steps") is not None or "seq" in self.record(fqid)

    # ------------------------------------------------------------ before a run
    async def prepare(self, runs: Sequence[RunSpec], start: str, given: str | None
                      ) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
        """Write each run's starting state into its work dir.

        Returns the runs whose state could not be written (with why: they must not start) and, for runs
        given a new starting state, that state's record (stored by the caller once the run is accepted).
        """
        unready: dict[str, str] = {}
        records: dict[str, dict[str, Any]] = {}
        now = time.time()
        for run in runs:
            if start != "given" and not self.concerned(run.fqid):
                continue
            cp = self.record(run.fqid)
            seq: int | None = cp.get("seq")
            new = True
            if start == "given" and given is not None:
                seq = 0 if seq is None else seq + 1
                text = relabel(given, run.fqid, seq, now)
                final = State.from_text(text).final
            elif seq is None or (start == "initial" and seq != 0):
                seq = 0 if seq is None else seq + 1
                text, final = initial_text(run.fqid, self.spec_of(run.fqid).get("steps"), seq, now), False
            elif seq == 0:
                text, final, new = initial_text(run.fqid, self.spec_of(run.fqid).get("steps"), 0,
                                                float(cp.get("time", now))), False, False
            else:
                row = await self.repo.state(run.fqid, seq)
                if row is None:
                    self.log.warning("newest state missing; starting from the initial state", fqid=run.fqid, seq=seq)
                    seq += 1
                    text, final = initial_text(run.fqid, self.spec_of(run.fqid).get("steps"), seq, now), False
                else:
                    text, final, new = row.data, row.final, False
            try:
                who = identity(run.owner)
                exported = await self._exports(run)
                if who is None:
                    write_state_dir(run.workdir / STATE_DIR, text, seq, exported)
                else:  # in the owner's work dir, as the owner: the files are theirs, a link there leads nowhere else
                    await anyio.to_thread.run_sync(_write_as, who, run.workdir / STATE_DIR, text, seq, exported)
            except (OSError, OwnerError) as exc:
                unready[run.fqid] = f"could not write its starting state: {exc}"
                continue
            if new:
                self.store(StateRow(run.fqid, seq, now, final, text))
                records[run.fqid] = {"seq": seq, "label": f"{run.fqid}:{seq}", "final": final, "time": now}
        return unready, records

    async def _exports(self, run: RunSpec) -> dict[str, str] | None:
        """The states an aggregator loads by label (its steps), from the repository."""
        spec = self.spec_of(run.fqid)
        if not spec.get("aggregates"):
            return None
        out: dict[str, str] = {}
        for label in Steps(spec.get("steps")):
            fqid, _, seq = label.rpartition(":")
            row = await self.repo.state(fqid, int(seq)) if seq.isascii() and seq.isdigit() else None
            if row is not None:
                out[label] = row.data
        return out

    # ------------------------------------------------------------ while and after
    def harvest(self, fqid: str, jobdir: Path, *, final: bool = False) -> dict[str, Any] | None:
        """The states a run saved since the last look, stored; the newest's record, or ``None``.

        ``jobdir``: the run's directory (its work dir is ``work/`` in it); ``final``: the run has ended, this is
        its last look (what was kept about it is dropped).
        """
        pointer = self._pointers.get(fqid)
        if pointer is None:
            pointer = self._pointers[fqid] = f"{jobdir}/work/{STATE_DIR}/current"
        try:  # one stat first: most runs save nothing, and a pointer not touched since the last look says nothing new
            seen = os.stat(pointer).st_mtime_ns
        except OSError:
            seen = None
        if final:  # its last look: nothing is kept about it
            self._pointers.pop(fqid, None)
        previous = self._looked.pop(fqid, None) if final else self._looked.get(fqid)
        if seen is None or seen == previous:
            return None
        workdir = jobdir / "work"
        directory = workdir / STATE_DIR
        top = workdir.parent.parent if "." in fqid else workdir.parent  # the top-level job's dir: only ours to replace
        try:
            current = int(read_inside(Path(pointer), top, limit=64).decode("ascii").strip())
        except (OSError, ValueError):
            return None
        if not 0 <= current < MAX_SEQ:  # the run's to write: a number the repository cannot hold stopped its writes
            return None
        if not final:
            self._looked[fqid] = seen
        known = int(self.record(fqid).get("seq", -1))
        if current <= known:
            return None
        newest: dict[str, Any] | None = None
        for seq in range(max(known + 1, current - self.keep + 1), current + 1):
            path = directory / f"{seq}.state"
            try:
                # never through a link out of the work dir (a link is refused): the run's owner made these files
                try:
                    text = read_inside(path, top, limit=self.max_size + STATE_SLACK).decode("utf-8", errors="replace")
                except PermissionError as exc:
                    raise StateError(f"{path}: {exc}") from None
                state = State.from_text(text, fqid=fqid)
            except OSError:
                continue  # pruned by the job meanwhile: newer ones follow
            except StateError as exc:
                self.log.warning("unreadable state", fqid=fqid, seq=seq, error=str(exc))
                continue
            if state.label != f"{fqid}:{seq}" or state.seq != seq:
                text = state.dump(f"{fqid}:{seq}", seq, state.time)
            when = state.time if state.time and math.isfinite(state.time) else time.time()  # (NaN: no time, NULL)
            self.store(StateRow(fqid, seq, when, state.final, text))
            newest = {"seq": seq, "label": f"{fqid}:{seq}", "final": state.final, "time": state.time}
        return newest


def _write_as(who: Identity, directory: Path, text: str, seq: int, exported: dict[str, str] | None) -> None:
    with fs_as(who):
        write_state_dir(directory, text, seq, exported)
