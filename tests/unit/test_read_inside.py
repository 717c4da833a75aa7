"""``read_inside``: how the orchestrator reads what a run wrote, never through a link out of the run's tree."""

from __future__ import annotations

import errno
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.plugin.rundirs import clear_outputs
from orchestrator.plugin.users import READ_LIMIT, read_inside, real_path
from orchestrator.runtime.runs import stderr_tail


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    top = tmp_path / "job"
    (top / "0" / "output").mkdir(parents=True)
    (top / "0" / "output" / "stderr").write_bytes(b"line 1\nline 2\n")
    (tmp_path / "secret").write_bytes(b"only the orchestrator may read this\n")
    return top


def test_a_file_inside_is_read_whole_or_its_tail(tree: Path) -> None:
    path = tree / "0" / "output" / "stderr"
    assert read_inside(path, tree) == b"line 1\nline 2\n"
    assert read_inside(path, tree, 7) == b"line 2\n"


def test_a_missing_file_or_directory_is_missing(tree: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_inside(tree / "0" / "output" / "orch.log", tree)
    with pytest.raises(FileNotFoundError):
        read_inside(tree / "1" / "output" / "orch.log", tree)


def test_a_link_as_the_file_is_refused(tree: Path) -> None:
    (tree / "0" / "output" / "orch.log").symlink_to(tree.parent / "secret")
    with pytest.raises(PermissionError, match="symbolic link"):
        read_inside(tree / "0" / "output" / "orch.log", tree)


def link_output_out(tree: Path) -> None:
    """The run's output dir made a link to a dir outside its tree (as its owner could)."""
    outside = tree.parent / "outside"
    outside.mkdir()
    (outside / "stderr").write_bytes(b"secret\n")
    os.rename(tree / "0" / "output", tree / "0" / "was-output")
    (tree / "0" / "output").symlink_to(outside)


def test_a_directory_linked_out_of_the_tree_is_refused(tree: Path) -> None:
    link_output_out(tree)
    with pytest.raises(PermissionError, match="leads out of"):
        read_inside(tree / "0" / "output" / "stderr", tree)


def test_a_directory_linked_within_the_tree_is_followed(tree: Path) -> None:
    (tree / "0" / "again").symlink_to(tree / "0" / "output")
    assert read_inside(tree / "0" / "again" / "stderr", tree) == b"line 1\nline 2\n"
    assert real_path(tree / "0" / "again") == os.path.realpath(tree / "0" / "output")


def test_a_base_reached_through_a_link_is_its_real_place(tree: Path) -> None:
    (tree.parent / "alias").symlink_to(tree)
    assert read_inside(tree.parent / "alias" / "0" / "output" / "stderr", tree.parent / "alias") == b"line 1\nline 2\n"
    assert read_inside(tree / "0" / "output" / "stderr", tree.parent / "alias") == b"line 1\nline 2\n"


def test_no_regular_file_is_refused(tree: Path) -> None:
    os.mkfifo(tree / "0" / "output" / "fifo")
    with pytest.raises(PermissionError, match="not a regular file"):
        read_inside(tree / "0" / "output" / "fifo", tree)


def test_a_base_read_from_before_still_refuses_a_directory_linked_out_later(tree: Path) -> None:
    assert read_inside(tree / "0" / "output" / "stderr", tree) == b"line 1\nline 2\n"  # its place now known
    link_output_out(tree)
    with pytest.raises(PermissionError, match="leads out of"):
        read_inside(tree / "0" / "output" / "stderr", tree)


def test_a_stderr_tail_is_its_last_lines_none_when_empty_and_never_through_a_link(tree: Path) -> None:
    stderr = tree / "0" / "output" / "stderr"
    stderr.write_bytes(b"a\n\nb\nc\nd\n")
    assert stderr_tail(stderr, tree) == "b | c | d"
    stderr.write_bytes(b"")
    assert stderr_tail(stderr, tree) is None
    stderr.unlink()
    assert stderr_tail(stderr, tree) is None
    stderr.symlink_to(tree.parent / "secret")
    assert stderr_tail(stderr, tree) is None


def test_a_file_over_the_limit_is_not_read_whole_and_its_tail_is_bounded(tree: Path) -> None:
    """A run's files are its to make: a sparse log of 50 GB, read whole, took the service's memory. A file over
    the limit (16 MiB unless the caller says) is refused with ``EFBIG``; its tail is read all the same."""
    path = tree / "0" / "output" / "orch.1.log"
    with open(path, "wb") as f:
        f.truncate(READ_LIMIT + 1)  # sparse: no disk used
    with pytest.raises(OSError) as refused:
        read_inside(path, tree)
    assert refused.value.errno == errno.EFBIG
    assert read_inside(path, tree, 10) == b"\0" * 10
    small = tree / "0" / "output" / "current"
    small.write_bytes(b"12345678901234567890\n")
    with pytest.raises(OSError):
        read_inside(small, tree, limit=8)
    assert read_inside(small, tree, limit=64) == b"12345678901234567890\n"


def test_an_output_tree_too_deep_to_remove_is_an_error_to_report(tmp_path: Path) -> None:
    """The next attempt empties the run's output dir: a tree the run made deeper than Python recurses raised
    ``RecursionError`` there, which the driver's loop let through (the service stopped). It is an ``OSError`` now,
    which fails the run's start, saying so."""
    out = tmp_path / "output"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    try:
        for _ in range(sys.getrecursionlimit() + 100):
            os.mkdir("a", dir_fd=fd)
            deeper = os.open("a", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = deeper
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="too deep to remove"):
        clear_outputs(out)
    subprocess.run(["rm", "-rf", str(out)], check=True)


def test_a_rename_in_a_runs_tree_is_made_where_it_was_checked(tree: Path, tmp_path: Path) -> None:
    """The attempt's log is renamed ``orch.log`` once read. By its path, after the check, it renamed a file in
    whatever the run's owner had swapped the output dir for meanwhile (another job's dir, through a link); now the
    rename is made in the directory checked, or not at all."""
    out = tree / "0" / "output"
    (out / "orch.1.log").write_text("100 START 1 h\n")
    read_inside(out / "orch.1.log", tree, rename_to="orch.log")
    assert sorted(p.name for p in out.iterdir()) == ["orch.log", "stderr"]
    elsewhere = tmp_path / "victim"
    elsewhere.mkdir()
    (elsewhere / "orch.2.log").write_text("another job's log\n")
    (tree / "1").mkdir()
    (tree / "1" / "output").symlink_to(elsewhere)
    with pytest.raises(PermissionError):
        read_inside(tree / "1" / "output" / "orch.2.log", tree, rename_to="orch.log")
    assert [p.name for p in elsewhere.iterdir()] == ["orch.2.log"]


def test_another_users_file_hard_linked_into_a_runs_dir_is_not_read(tree: Path, tmp_path: Path) -> None:
    """Where ``fs.protected_hardlinks`` is 0, a run's owner may give a file only the orchestrator may read a name
    in their own dir: such a file (its owner not the dir's, more than one name) is refused like a symbolic link."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the dir is another user's")
    nobody = pwd.getpwnam("nobody")
    out = tree / "0" / "output"
    os.chown(out, nobody.pw_uid, nobody.pw_gid)
    os.link(tmp_path / "secret", out / "orch.1.log")  # root's file, a second name in nobody's dir
    with pytest.raises(PermissionError, match="linked here"):
        read_inside(out / "orch.1.log", tree)
    (out / "mine").write_text("theirs\n")
    os.chown(out / "mine", nobody.pw_uid, nobody.pw_gid)
    os.link(out / "mine", out / "also-mine")  # the owner's own file, two names: theirs to read
    assert read_inside(out / "also-mine", tree) == b"theirs\n"
