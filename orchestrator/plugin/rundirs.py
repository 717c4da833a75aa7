"""A run's directories on this machine: its job dir, output dir and work dir, the links to its input files, and
the hint to ext4 that the job dirs beside each other are unrelated. Made by the driver that starts the run, before
the wrapper (or the launcher) makes the run's files in them. Re-exported by :mod:`.wrapper`, where drivers import
them from."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import platform
import shutil
import struct
from array import array
from pathlib import Path

from .contract import RunSpec
from .users import Identity, fs_as

#: ext2/3/4's "top of directory hierarchies" flag (``chattr +T``), and the ioctls that read and set a file's flags
#: (``_IOR('f', 1, long)``, ``_IOW('f', 2, long)``, in the generic encoding of the architectures named).
FS_TOPDIR_FL = 0x00020000
_LONG = struct.calcsize("l")
_FLAGS_IOCTLS = ((2 << 30 | _LONG << 16 | 0x6601, 1 << 30 | _LONG << 16 | 0x6602)
                 if platform.machine() in ("x86_64", "aarch64", "i386", "i686", "armv7l", "riscv64") else None)
_top_dirs: set[str] = set()


def mark_top_dir(path: Path) -> bool:
    """Tell the filesystem that ``path``'s subdirectories are unrelated (a master's subjob dirs, the workspace's job
    dirs), where it has the notion: ext2/3/4's ``chattr +T``, which makes the Orlov allocator spread them over the
    disk's block groups instead of packing them into one. On an ext4 without a journal that matters a great deal:
    a new inode is taken only after every inode deleted in the last minutes of its block group has been passed
    over, so a group that held a thousand runs just removed makes each of the next thousand runs' files cost half a
    millisecond of kernel time; spread over the groups they cost 30 microseconds (benchmarks/README.md). Best
    effort: ``False`` where the flag cannot be set (another filesystem, another owner)."""
    if _FLAGS_IOCTLS is None:
        return False
    get, put = _FLAGS_IOCTLS
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        flags = array("i", [0])
        fcntl.ioctl(fd, get, flags, True)
        if not flags[0] & FS_TOPDIR_FL:
            flags[0] |= FS_TOPDIR_FL
            fcntl.ioctl(fd, put, flags, True)
        return True
    except OSError:  # no such flags here (ENOTTY, EOPNOTSUPP), or not ours to change (EPERM)
        return False
    finally:
        os.close(fd)


def make_run_dirs(run: RunSpec, owner: Identity | None = None) -> None:
    """Make what a run needs on this machine to start, and nothing more: its job dir, its output dir (emptied
    of an earlier attempt's files) and its work dir (three ``mkdir`` calls for a first attempt), and links to
    its input files. The wrapper makes the files (``orch.<attempt>.log``, ``stdout``, ``stderr``,
    ``orch.usage``) itself, in the run's own process. The directory that holds the job dirs is marked once as
    the top of unrelated hierarchies (:func:`mark_top_dir`).

    ``owner``: the run's owner when it is not the orchestrator's own user. The subjobs' master's dir (and a
    top-level job's own dir) is made theirs first (mode 0700); then everything inside is done with the
    owner's file system ids (:func:`~.users.fs_as`), so the directories and links are theirs and a link the
    owner left in place of one (``output`` pointing elsewhere) leads nowhere the owner could not go."""
    _mark_parent(os.path.dirname(os.fspath(run.jobdir)))
    if owner is None:
        _make_dirs(run.jobdir, run.outputdir, run.workdir)
        link_inputs(run)
        return
    _own_master_dir(run, owner)
    with fs_as(owner):
        _make_dirs(run.jobdir, run.outputdir, run.workdir)
        for d in (run.jobdir, run.outputdir, run.workdir):
            own_dir(d, owner)
        link_inputs(run)


def make_usual_dirs(jobdir: str) -> None:
    """:func:`make_run_dirs` for a run of the orchestrator's own user without input files, whose directories are
    ``output`` and ``work`` in ``jobdir``: from a string, for a driver that keeps no RunSpec for a run waiting its
    turn (``local``: path objects cost more than the calls, ``benchmarks/README.md``, issue 26)."""
    _mark_parent(os.path.dirname(jobdir))
    _make_dirs(jobdir, jobdir + "/output", jobdir + "/work")


def _mark_parent(parent: str) -> None:
    if parent not in _top_dirs:
        os.makedirs(parent, exist_ok=True)
        mark_top_dir(Path(parent))
        _top_dirs.add(parent)


def _make_dirs(jobdir: str | Path, outputdir: str | Path, workdir: str | Path) -> None:
    with contextlib.suppress(FileExistsError):
        os.mkdir(jobdir)
    try:
        os.mkdir(outputdir)
    except FileExistsError:  # an earlier attempt's
        clear_outputs(Path(outputdir))
    with contextlib.suppress(FileExistsError):  # an earlier attempt's, or the one its checkpoint state went into
        os.mkdir(workdir)


def own_dir(path: Path, owner: Identity, mode: int = 0o700) -> None:
    """``path`` (a directory, never a link) made ``owner``'s, with ``mode``."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != (owner.uid, owner.gid):
            os.fchown(fd, owner.uid, owner.gid)
        if st.st_mode & 0o7777 != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _own_master_dir(run: RunSpec, owner: Identity) -> None:
    """The dir the run's own dirs are made in, as the owner: a subjob's master dir (``workspace/<id>``, holding
    its shared inputs), or a top-level job's own dir (made here if the job never had one). The owner's."""
    top = run.jobdir.parent if "." in run.fqid else run.jobdir
    if (top, owner.uid) in _owned_dirs:
        return
    with contextlib.suppress(FileExistsError):
        os.mkdir(top, 0o700)
    own_dir(top, owner)
    _owned_dirs.add((top, owner.uid))


_owned_dirs: set[tuple[Path, int]] = set()


def link_inputs(run: RunSpec) -> None:
    """Each input file as a link of the same name in the run's work dir (an earlier attempt's replaced)."""
    for src in run.inputs:
        link = run.workdir / src.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(src)


#: Files of an output dir that outlive an attempt: the CPU records of every attempt (useful and wasted CPU).
KEPT = frozenset({"orch.usage"})


def clear_outputs(outputdir: Path) -> None:
    """Empty an output dir before a new run writes into it (the attempts' CPU records stay)."""
    if outputdir.is_dir():
        for entry in outputdir.iterdir():
            if entry.name in KEPT:
                continue
            if entry.is_dir() and not entry.is_symlink():
                try:
                    shutil.rmtree(entry)
                except RecursionError:  # a tree a run made deeper than Python recurses: an error to report, no crash
                    raise OSError(errno.ELOOP, f"{entry} is too deep to remove") from None
            else:
                entry.unlink()
