"""``read_inside``: how the orchestrator reads what a run wrote, never through a link out of the run's tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.plugin.users import read_inside, real_path
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
