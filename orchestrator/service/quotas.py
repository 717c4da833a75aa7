"""A team service's quotas (``[service] max_active_per_user``, ``max_subjobs_per_master``).

As HTCondor's ``MAX_JOBS_PER_OWNER``: the limits belong to the service, and a
request over one is refused before anything of it is stored, with a
:class:`~orchestrator.core.errors.JobError` that names the job, the setting
(its ``field``) and the limit (answered 409; the CLI exits 2).

- ``max_subjobs_per_master``: most subjobs a job's splitter may make.
- ``max_active_per_user``: most active runs (submitting, submitted, running,
  completing) of one owner, counted over all their jobs; a submission or a
  resubmission that would pass it is refused whole.

0 (the default) is no limit. The runtime asks :meth:`Quotas.admit` once a
job's split is made and before it is stored; a resubmission is checked by
:meth:`Quotas.check_resubmit` before it is asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core.errors import ConfigError, JobError
from ..core.ids import FQID, fqid_str
from ..core.statuses import ACTIVE, resubmitted_from

#: The settings, in the [service] table.
SETTINGS = ("max_active_per_user", "max_subjobs_per_master")


class Quotas:
    """The limits of one service over one state machine; ``owner_of`` names a top-level job's owner."""

    def __init__(self, section: Mapping[str, Any], sm: Any, owner_of: Callable[[int], str | None]) -> None:
        for key in SETTINGS:
            value = section.get(key, 0)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"service.{key} must be an integer of at least 0 (0: no limit), not {value!r}")
        self.max_active = int(section.get("max_active_per_user", 0))
        self.max_subjobs = int(section.get("max_subjobs_per_master", 0))
        self.sm = sm
        self.owner_of = owner_of

    def active_of(self, owner: str) -> int:
        """Active runs of ``owner``'s jobs, all together."""
        total = 0
        for job in self.sm.job_ids():
            if self.owner_of(job) != owner:
                continue
            if self.sm.is_master(job):
                counts = self.sm.counts(job)
                total += sum(counts.get(status, 0) for status in ACTIVE)
            elif self.sm.status((job,)) in ACTIVE:
                total += 1
        return total

    def admit(self, job: int, spec: Mapping[str, Any], n: int) -> None:
        """Refuse (JobError) when job ``job``'s ``n`` runs, about to be stored and sent, pass a limit."""
        if self.max_subjobs and spec.get("splitter") is not None and n > self.max_subjobs:
            raise JobError(f"the splitter makes {n} subjobs; this service allows at most {self.max_subjobs} per job "
                           f"([service] max_subjobs_per_master = {self.max_subjobs})", fqid=str(job),
                           field="max_subjobs_per_master")
        self._check_active(str(job), self.owner_of(job) or spec.get("owner"), n)

    def check_resubmit(self, targets: Sequence[FQID], only_failed: bool) -> None:
        """Refuse a resubmission of ``targets`` whose runs would pass an owner's ``max_active_per_user``."""
        if not self.max_active:
            return
        wanted: dict[str, tuple[str, int]] = {}
        again = resubmitted_from(only_failed)
        for fq in targets:
            owner = self.owner_of(fq[0])
            if owner is None:
                continue
            if len(fq) == 1 and self.sm.is_master(fq[0]):
                counts = self.sm.counts(fq[0])
                n = sum(counts.get(status, 0) for status in again)
            else:
                n = 0 if self.sm.status(fq) in ACTIVE else 1
            first, had = wanted.get(owner, (fqid_str(fq), 0))
            wanted[owner] = (first, had + n)
        for owner, (fqid, n) in wanted.items():
            self._check_active(fqid, owner, n)

    def _check_active(self, fqid: str, owner: str | None, n: int) -> None:
        if not self.max_active or owner is None or n <= 0:
            return
        active = self.active_of(owner)
        if active + n > self.max_active:
            raise JobError(f"{n} more active subjobs would make {owner}'s {active + n} ({active} now); this service "
                           f"allows at most {self.max_active} per user ([service] max_active_per_user = "
                           f"{self.max_active})", fqid=fqid, field="max_active_per_user")


__all__ = ["SETTINGS", "Quotas"]
