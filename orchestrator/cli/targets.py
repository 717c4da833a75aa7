"""Several ids and ranges per command, as ``scancel`` and Ganga's ``select(ids=...)`` take them.

``kill 3.1 3.4``, ``kill 3.[0-9]``, ``resubmit 3.0-99``, ``show 3 4 5``, ``release 3-5``: each argument is an
id or a range (:func:`~orchestrator.core.ids.parse_id_range`); a range of subjobs becomes one collective
operation on a slice of its master (one request, however many subjobs), never a call per subjob.
Every id is looked up before anything is done, so a typo in the third id acts on none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click

from ..api.job import Job
from ..api.orchestrator import Orchestrator
from ..api.slices import JobSlice
from ..core.ids import FQID, as_range, fqid_str, parse_id_range
from .app import CliError

#: One argument's worth: ``(prefix, None)`` names the job ``prefix``; ``(prefix, indexes)`` those subjobs of it.
Named = tuple[FQID, Sequence[int] | None]


def _parse(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> list[Named]:
    named: list[Named] = []
    for value in values:
        try:
            named.extend(parse_id_range(value))
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
    return named


def job_ids_argument(f: Callable[..., Any]) -> Callable[..., Any]:
    """``ID...``: one or more ids or ranges (``3``, ``3.1``, ``3-5``, ``3.0-99``, ``3.[0-9,12]``)."""
    return click.argument("job_ids", metavar="ID...", nargs=-1, required=True, callback=_parse)(f)


@dataclass(frozen=True)
class Target:
    """A job, or some subjobs of a master, as one argument named them."""

    #: The job itself, or the master whose subjobs ``indexes`` are meant.
    job: Job
    indexes: Sequence[int] | None

    @property
    def label(self) -> str:
        """How messages name it: ``3.1``, or ``3.[0-9]`` for a range of subjobs."""
        if self.indexes is None:
            return self.job.fqid
        whole = as_range(self.indexes)
        shown = f"{whole.start}-{whole.stop - 1}" if whole is not None else ",".join(map(str, self.indexes))
        return f"{self.job.fqid}.[{shown}]"

    @property
    def slice(self) -> JobSlice:
        """What collective operations act on."""
        if self.indexes is None:
            return JobSlice([self.job])
        return self.job.subjobs.select(ids=self.indexes)

    def jobs(self) -> list[Job]:
        """The jobs named, built (for the commands that show each)."""
        return [self.job] if self.indexes is None else list(self.slice)


def lookup(orch: Orchestrator, ident: str) -> Job:
    try:
        job: Job = orch.jobs(ident)
    except KeyError:
        raise CliError(f"no job {ident}") from None
    return job


def resolve(orch: Orchestrator, named: Sequence[Named]) -> list[Target]:
    """Every named job looked up, every range checked against its master's subjobs: errors before any action."""
    out: list[Target] = []
    for prefix, indexes in named:
        job = lookup(orch, fqid_str(prefix))
        if indexes is not None:
            n = len(job.subjobs)
            beyond = [i for i in indexes if i >= n]
            if beyond:
                has = f"subjobs 0-{n - 1}" if n else "no subjobs"
                raise CliError(f"job {job.fqid} has {has}; no subjob {job.fqid}.{beyond[0]}")
        out.append(Target(job, indexes))
    return out


__all__ = ["Named", "Target", "job_ids_argument", "lookup", "resolve"]
