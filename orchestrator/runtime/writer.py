"""Persistence: the state machine's changes, written behind in batches, and read back at open.

The state machine marks what changed (runs of a job, a job's own row); at
each flush the writer takes that, reads the current values, and writes
them in one transaction: a job's run arrays as blobs, the extras of the runs
that changed and have any, new backend ids, changed definitions, harvested
checkpoint states. A ``Persist`` instruction is a flush the runtime waits
for (write-ahead); otherwise the flush loop writes every ``flush_interval``.

A flush is shielded from cancellation: a SIGTERM that lands mid-write lets
the transaction finish (or roll back whole) and the next flush start clean;
if the write fails, what it took is marked dirty again, so nothing is lost.

Unless the repository refused the values themselves (:meth:`Repository.refuses`:
a constraint, a value it cannot hold). Those would be refused again at every
flush, and the flush, put back whole each time, would never write anything of
anyone's jobs again. So a refused flush is written again one job at a time:
the other jobs' changes go in, and those of a job refused are left out, said
in the log (the job, the reason) and counted (:meth:`Writer.statistics`, the
metric ``orchestrator_repository_refusals_total``). The job's next change
writes its row and all its run arrays again, not only what changed, so what
the repository lacks of it then is what it still refuses.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from ..core.events import Profile
from ..core.machine import StateMachine
from ..core.table import RunExtra, RunTable
from ..plugin.logs import get_logger
from . import gcpause
from .definitions import Definitions
from .repository import Loaded, Repository, RunsRow, Save, StateRow, TopRow, dumps, ranges_of

log = get_logger(component="writer")

#: The most of a refusal's message the log keeps (it may quote the value refused, a job's own data).
REASON_WIDTH = 500


@dataclass(frozen=True, slots=True)
class WriterStatistics:
    """What the writer did that a flush does not show (trio's ``statistics()``: read, never reached into)."""

    #: Jobs' changes the repository refused, left out (one a job and a flush).
    refused: int


class Writer:
    def __init__(self, sm: StateMachine, repo: Repository, definitions: Definitions, states_kept: int) -> None:
        self.sm = sm
        self.repo = repo
        self.definitions = definitions
        self.states_kept = states_kept
        #: Backend ids not written yet, by job: subjob index (``None``: the job itself) -> id.
        self.backend_ids: dict[int, dict[int | None, str | None]] = {}
        #: Those of the flush under way, until its transaction is committed (a read meanwhile must not find
        #: the id before them in the repository; the definitions keep the deltas under way likewise).
        self._writing: dict[int, dict[int | None, str | None]] = {}
        self.states: list[StateRow] = []
        self._lock = anyio.Lock()
        #: Subjobs whose stored extras are not NULL, by master: a run that moves and has no extras (most of a
        #: million) needs no write of its row, only one that has them now or had them.
        self._with_info: dict[int, set[int]] = {}
        #: Jobs whose changes the repository refused: their next write is of all they hold, not what changed.
        self._refused: set[int] = set()
        self._refusals = 0

    def statistics(self) -> WriterStatistics:
        return WriterStatistics(refused=self._refusals)

    def loaded(self, loaded: Loaded) -> None:
        """What the repository held when the home was opened (which subjobs have extras stored)."""
        self._with_info = {master: set(infos) for master, infos in loaded.infos.items()}

    async def forget(self, job: int) -> None:
        """``Forget``: a removed job leaves the state machine, the definitions and the repository (what was
        written before is flushed first; the removal is not cut short)."""
        await self.flush()
        self.sm.forget(job)
        self.definitions.forget(job)
        with anyio.CancelScope(shield=True):
            await self.repo.remove_job(job)

    def add_state(self, row: StateRow) -> None:
        """A checkpoint state a run saved (or starts from), written with the next flush."""
        self.states.append(row)

    def record_ids(self, job: int, indexes: Sequence[int] | None, ids: Sequence[str]) -> None:
        """Backend ids a driver answered with, for runs ``indexes`` of ``job`` (``None``: the job itself)."""
        if indexes is None:
            if ids:
                self.backend_ids.setdefault(job, {})[None] = ids[0]
            return
        self.backend_ids.setdefault(job, {}).update(zip(indexes, ids, strict=True))

    def backend_id(self, job: int, index: int | None) -> str | None:
        """A run's backend id: the newest one, written or not."""
        for ids in (self.backend_ids, self._writing):  # the newer first
            pending = ids.get(job, {})
            if index in pending:
                return pending[index]
        if index is None:
            return self.repo.top_backend_id(job)
        row = self.repo.subjob_rows(job, [index]).get(index)
        return row[0] if row else None

    async def flush(self) -> None:
        """Write everything changed since the last flush, in one transaction."""
        async with self._lock:
            with gcpause.paused():  # the rows of ten thousand runs: short-lived, nothing cyclic
                await self._flush()

    async def _flush(self) -> None:
        dirty, tops = self.sm.take_dirty()
        ids, self.backend_ids = self.backend_ids, {}
        states, self.states = self.states, []
        specs, self.definitions.dirty = self.definitions.dirty, set()
        deltas, self.definitions.dirty_deltas = self.definitions.dirty_deltas, {}
        written: dict[int, dict[int, bool]] = {}
        batch = self._batch(dirty, tops, ids, states, specs, deltas, written)
        if not batch:
            return
        self._writing, self.definitions.writing_deltas = ids, deltas
        try:
            refused = await self._save(batch)
            for job, rows in written.items():
                if job in refused:
                    continue
                stored = self._with_info.setdefault(job, set())
                for i, has in rows.items():
                    if has:
                        stored.add(i)
                    else:
                        stored.discard(i)
        except BaseException:
            for job, indexes in dirty.items():
                self.sm.mark_dirty(job, indexes)
            for job in tops:
                self.sm.mark_dirty(job, set())
            for job, pending in self.backend_ids.items():
                ids.setdefault(job, {}).update(pending)
            self.backend_ids = ids
            self.states[:0] = states
            self.definitions.dirty |= specs
            self.definitions.dirty_deltas = {**deltas, **self.definitions.dirty_deltas}
            raise
        finally:
            self._writing, self.definitions.writing_deltas = {}, {}

    async def _save(self, batch: Save) -> set[int]:
        """Write ``batch``; returns the jobs whose changes the repository refused (left out, the rest written).
        Any other failure raises, and the caller puts the whole flush back (a job written alone before it is
        written again: the same values)."""
        try:
            with anyio.CancelScope(shield=True):
                await self.repo.save(batch)
            if self._refused:  # written whole (:meth:`_batch`): what was refused of them is not refused now
                self._refused.difference_update(top.id for top in batch.tops)
            return set()
        except Exception as exc:
            if not self.repo.refuses(exc):
                raise
            error: Exception = exc
        parts = apart(batch)
        if len(parts) == 1:  # the flush was this job's alone: its refusal is the flush's
            return self._refuse({job: error for job in parts})
        refused: dict[int, Exception] = {}
        for job, part in parts.items():
            try:
                with anyio.CancelScope(shield=True):
                    await self.repo.save(part)
                self._refused.discard(job)
            except Exception as exc:
                if not self.repo.refuses(exc):
                    raise
                refused[job] = exc
        return self._refuse(refused)

    def _refuse(self, refused: dict[int, Exception]) -> set[int]:
        """Jobs whose changes the repository refused: said, counted, written whole at their next change."""
        for job, why in refused.items():
            self._refused.add(job)
            self._refusals += 1
            log.error("the repository refused a job's changes: they are left out, and the other jobs' written; "
                      "its next change writes all of the job again", fqid=str(job), repository=self.repo.where,
                      error=f"{type(why).__name__}: {why}"[:REASON_WIDTH])
        return set(refused)

    def _batch(self, dirty: dict[int, set[int] | None], tops: set[int], ids: dict[int, dict[int | None, str | None]],
               states: list[StateRow], specs: set[int], deltas: dict[tuple[int, int], dict[str, Any]],
               written: dict[int, dict[int, bool]]) -> Save:
        """The rows to write; ``written`` gets, per master, the subjobs whose extras are written (True: some)."""
        batch = Save(states=states, keep=self.states_kept)
        sm = self.sm
        for job in sorted(tops | set(dirty) | specs):
            if (job,) not in sm:
                self._with_info.pop(job, None)
                self._refused.discard(job)
                continue
            again = job in self._refused  # all it holds: what was refused of it is not known
            batch.tops.append(top_row(sm, job, self.definitions, with_spec=job in specs or again))
            if job in dirty or again:
                indexes = None if again else dirty[job]
                if indexes is None or indexes:  # (an empty set: marked, but none of its runs changed)
                    batch.runs.append(runs_row(sm, job, indexes))
                if sm.is_master(job):
                    infos = sm.run_infos(job, indexes)
                    rows = written[job] = {}
                    for i, info in infos.items():
                        batch.infos.append((job, i, dumps(info)))
                        rows[i] = True
                    for i in self._with_info.get(job, ()):  # stored before, nothing now: cleared
                        if i not in infos and (indexes is None or i in indexes):
                            batch.infos.append((job, i, None))
                            rows[i] = False
        batch.backend_ids = [(job, idx, b) for job, pending in ids.items() if (job,) in self.sm
                             for idx, b in pending.items()]
        batch.deltas = [(job, idx, dumps(d)) for (job, idx), d in deltas.items() if (job,) in self.sm]
        return batch


# ------------------------------------------------------------------ rows
def apart(batch: Save) -> dict[int, Save]:
    """``batch`` as one :class:`Save` a top-level job, in job order."""
    parts: dict[int, Save] = {}

    def part(job: int) -> Save:
        found = parts.get(job)
        if found is None:
            found = parts[job] = Save(keep=batch.keep)
        return found

    for top in batch.tops:
        part(top.id).tops.append(top)
    for runs in batch.runs:
        part(runs.job).runs.append(runs)
    for info in batch.infos:
        part(info[0]).infos.append(info)
    for backend_id in batch.backend_ids:
        part(backend_id[0]).backend_ids.append(backend_id)
    for delta in batch.deltas:
        part(delta[0]).deltas.append(delta)
    for state in batch.states:  # (a state's job is a run's fqid: "3.1")
        part(int(state.job.partition(".")[0])).states.append(state)
    return dict(sorted(parts.items()))


def top_row(sm: StateMachine, job: int, definitions: Definitions, *, with_spec: bool) -> TopRow:
    """A top-level job's own row, from the state machine's record of it (:mod:`orchestrator.core.records`)."""
    rec = sm.stored_job(job)
    return TopRow(job, definitions.names.get(job, ""), rec.status, definitions.specs.get(job) if with_spec else None,
                  None, rec.info, rec.n_subjobs, rec.created)


def runs_row(sm: StateMachine, job: int, changed: set[int] | None = None) -> RunsRow:
    """The job's run arrays; ``changed``: the runs changed since they were last written (``None``: any)."""
    arrays = sm.run_arrays(job)
    few = ranges_of(changed) if changed and len(changed) * 4 < len(arrays.status) else None  # else all, in one write
    return RunsRow(job, arrays.status, arrays.attempt, arrays.times, few)


def restore(sm: StateMachine, loaded: Loaded, definitions: Definitions,
            profile_of: Any = None) -> list[int]:
    """Load every stored job into the state machine and the definitions; returns the job ids."""
    ids = []
    for row in loaded.tops:
        assert row.spec is not None
        try:
            if not isinstance(row.spec, dict):
                raise TypeError(f"a definition is a JSON object, not {type(row.spec).__name__}")
            json.dumps(row.spec, allow_nan=False)  # (NaN, which an earlier version stored: no write of it would do)
            definitions.add(row.id, row.name, row.spec)
            profile: Profile = definitions.profile(row.id)
        except Exception as exc:  # defence in depth: one unreadable stored definition never stops the rest
            definitions.forget(row.id)
            log.error("a stored job definition is unreadable: the job is left out until it is mended", fqid=str(row.id),
                      error=f"{type(exc).__name__}: {exc}")
            continue
        info = row.info
        stored = loaded.runs.get(row.id)
        table = None
        if stored is not None:
            n = len(stored.status)
            extras = {i: RunExtra.from_dict(e) for i, e in loaded.infos.get(row.id, {}).items()}
            if not row.n_subjobs and info.get("run"):
                extras = {0: RunExtra.from_dict(info["run"])}
            table = RunTable.restore(bytearray(stored.status), array("I", stored.attempt),
                                     {k: array("d", v) for k, v in stored.times.items()}, extras)
            assert len(table) == n
        link = info.get("link")
        sm.load(row.id, profile, created=row.added, table=table, top=info.get("top"),
                partition=info.get("partition"), attempt=int(info.get("attempt", 0)),
                link=(int(link[0]), str(link[1])) if link else None, post_failed=bool(info.get("post_failed")),
                merged_at=float(info.get("merged_at", 0.0)), master=row.n_subjobs > 0)
        ids.append(row.id)
    return ids
