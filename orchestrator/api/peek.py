"""``job.peek()``: the text of a run's file, without hunting for paths."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..core.errors import JobError
from ..plugin.users import Identity, read_tail_as

#: The most a peek reads of a file's end when ``tail`` is not given.
MAX_BYTES = 4 * 1024 * 1024


def _tail(path: Path, most: int) -> bytes:
    """The last ``most`` bytes of ``path``, a regular file: opened without waiting (a FIFO the run made would keep
    its reader waiting for a writer, for ever), then refused if it is something else."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PermissionError(f"{path.name} is not a regular file")
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - most))
        return f.read()


def read_file(jobdir: Path, name: str, tail: int | None, *, running: bool, fqid: str,
              owner: Identity | None = None) -> str:
    """``name`` in the output dir once the run ended, in its work dir while it runs (stdout and stderr are
    always written to the output dir). ``tail``: the last n lines. Never through a link out of the job's
    directory; ``owner`` (another user than the orchestrator's): read as that user, with their rights."""
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise JobError(f"{name!r} is not a file of the job's directory", fqid=fqid, field="name")
    if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
        raise JobError(f"tail must be a number of lines >= 0, not {tail!r}", fqid=fqid, field="tail")
    places = [jobdir / "output" / name]
    if running:
        places.insert(0, jobdir / "work" / name)
    for path in places:
        try:
            resolved = path.resolve()
            if not resolved.is_relative_to(jobdir.resolve()):
                raise JobError(f"{name!r} leads out of the job's directory", fqid=fqid, field="name")
            if owner is not None:
                text = read_tail_as(owner, resolved, MAX_BYTES).decode(errors="replace")
            else:
                text = _tail(resolved, MAX_BYTES).decode(errors="replace")
        except FileNotFoundError:
            continue
        except PermissionError as exc:
            raise JobError(f"cannot read {name!r}: {exc}", fqid=fqid, field="name") from None
        if tail is not None:
            lines = text.splitlines(keepends=True)
            return "".join(lines[-tail:]) if tail else ""
        return text
    raise JobError(f"has no file {name!r} (looked in {', '.join(str(p.parent) for p in places)})", fqid=fqid,
                   field="name")
