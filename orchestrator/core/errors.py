"""The exceptions a user of the public API sees."""

from __future__ import annotations


class OrchestratorError(Exception):
    """Base of every error this package raises on purpose."""


class JobError(OrchestratorError):
    """An operation on a job was refused or failed; the message names the job."""

    def __init__(self, message: str, *, fqid: str | None = None, field: str | None = None) -> None:
        prefix = f"job {fqid}: " if fqid is not None else ""
        where = f" [field {field}]" if field else ""
        super().__init__(f"{prefix}{message}{where}")
        self.fqid = fqid
        self.field = field


class NotOwnerError(JobError):
    """The job belongs to another user, and the caller is not an admin: the message says whose it is.

    ``owner`` is the job's owner, ``user`` the caller.
    """

    def __init__(self, fqid: str | None, *, owner: str, user: str) -> None:
        Exception.__init__(self, f"job {fqid} belongs to {owner}; you are {user}")
        self.fqid = fqid
        self.field = None
        self.owner = owner
        self.user = user


class HomeLockedError(OrchestratorError):
    """Another process holds this orchestrator home."""


class RepositoryHeldError(HomeLockedError):
    """Another process writes this home's repository (a shared one: it holds the lease), or took it over from
    this one. ``leader`` says where that process answers (``socket``, ``tcp_port``, ``host``, ``pid``) when it
    is a service that published it, else ``None``."""

    def __init__(self, message: str, leader: dict[str, object] | None = None) -> None:
        super().__init__(message)
        self.leader = dict(leader) if leader else None


class RepositoryError(OrchestratorError):
    """A home's database file cannot be used: damaged, or a write to it failed. The message names the file,
    says what SQLite said, and what to do; ``path`` is the file."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class Lagging(OrchestratorError):
    """An observer of the events (``orch.events()``, the service's stream) fell further behind than
    ``events_buffer`` allows and was dropped: it has seen every event up to here, and nothing after.
    Subscribe again (and read a snapshot) to go on."""


class ConfigError(OrchestratorError):
    """The configuration file is invalid; the message names the file and the key."""


class UnknownJobError(JobError, KeyError):
    """No job has this id (or name): a ``KeyError`` too, as ``orch.jobs[...]`` is a mapping.

    Its message names what was looked for ("no job 3.7"); ``fqid`` is that id.
    """

    def __init__(self, message: str, *, fqid: str | None = None, field: str | None = None) -> None:
        Exception.__init__(self, message)
        self.fqid = fqid
        self.field = field

    def __str__(self) -> str:
        return str(self.args[0])


class WaitTimeout(TimeoutError):
    """``wait(timeout=...)`` ran out while jobs were still active: the message names them (the first ten, and
    how many in all), the same through a service as embedded; ``active`` holds their fqids."""

    def __init__(self, active: list[str], timeout: float | None) -> None:
        shown = ", ".join(active[:10]) + (f", ... ({len(active)} in all)" if len(active) > 10 else "")
        noun = "job" if len(active) == 1 else "jobs"
        super().__init__(f"{noun} {shown} still active after {timeout:g} s" if timeout is not None
                         else f"{noun} {shown} still active")
        self.active = list(active)
        self.timeout = timeout


def leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The exceptions a task group's error group holds, however deeply nested: the one a user reads, when alone."""
    out: list[BaseException] = []
    for e in group.exceptions:
        out += leaves(e) if isinstance(e, BaseExceptionGroup) else [e]
    return out


def reraise_unwrapped(group: BaseExceptionGroup[BaseException], body: BaseException | None = None) -> None:
    """Leaving a task group that failed: a user reads the one error inside, not a group of one. Returns when
    the group holds only ``body`` (the ``async with`` body's own exception, which then goes on by itself);
    raises the single error unwrapped; else the group as it is."""
    inner = leaves(group)
    if body is not None and inner == [body]:
        return
    if len(inner) == 1:
        raise inner[0] from None
    raise group
