"""``EventLines``: the events appended to a file, read on from where the last read stopped; ``decimal``, the
numbers in them."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.plugin.wrapper import MAX_EVENT_LINE, EventLines, decimal


def test_an_open_file_read_on_gives_whole_lines_once_and_waits_for_a_partial_one(tmp_path: Path) -> None:
    path = tmp_path / "events.log"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    by_fd, by_path = EventLines(), EventLines()
    try:
        with open(path, "ab", buffering=0) as f:
            f.write(b"k1 START 10 1.0\nshort\nk1 EN")
            assert by_fd.read_from(fd) == by_path.read(path) == [["k1", "START", "10", "1.0"]]
            f.write(b"D 0 2.0\n")
            assert by_fd.read_from(fd) == by_path.read(path) == [["k1", "END", "0", "2.0"]]
            assert by_fd.read_from(fd) == by_path.read(path) == []
            many = b"".join(b"k%d END 0 3.0\n" % i for i in range(100_000))  # more than one read's worth
            f.write(many)
            got = by_fd.read_from(fd)
            assert len(got) == 100_000 and got[-1] == ["k99999", "END", "0", "3.0"]
            assert by_fd.offset == by_path.offset + len(many) == os.path.getsize(path)
    finally:
        os.close(fd)


@given(st.text(max_size=24) | st.from_regex(r"-?[0-9]{1,22}", fullmatch=True))
def test_decimal_takes_ascii_integers_and_never_raises(word: str) -> None:
    """``decimal`` is how a driver takes a number a run may have written (``START pid``, ``END code``): whatever
    the word, it answers, and only an integer in ASCII digits is one ('²' and '٣' are digits to ``isdigit``)."""
    got = decimal(word)
    digits = word[1:] if word.startswith("-") else word
    if digits.isascii() and digits.isdigit() and len(digits) < 20:
        assert got == int(word)
    else:
        assert got is None


def test_decimal_refuses_what_isdigit_takes_and_int_does_not() -> None:
    assert [decimal(w) for w in ("\u00b2", "--5", "-\u00b2", "\u0663", "", "-", "+5", " 5", "12", "-12")] == [
        None, None, None, None, None, None, None, None, 12, -12]


def test_a_line_over_the_longest_event_is_skipped_never_kept_whole(tmp_path: Path) -> None:
    """An events file is the runs' to write: a line of gigabytes without a newline, joined again at each read of
    it, hung the driver (quadratic). Past ``MAX_EVENT_LINE`` a line is dropped up to its newline; the events after
    it are read as ever, and a read may be bounded (``most``: the rest comes next time)."""
    path = tmp_path / "events.log"
    lines = EventLines()
    with open(path, "wb") as f:
        f.write(b"k0 START 9 1.0\n" + b"x" * (3 * MAX_EVENT_LINE))
        f.flush()
        assert lines.read(path) == [["k0", "START", "9", "1.0"]]
        f.write(b"x" * MAX_EVENT_LINE + b" tail\nk1 START 10 1.0\n" + b"y " * MAX_EVENT_LINE + b"\nk1 END 0 2.0\n")
    assert lines.read(path) == [["k1", "START", "10", "1.0"], ["k1", "END", "0", "2.0"]]
    bounded = EventLines()
    first = bounded.read(path, most=20)
    assert first == [["k0", "START", "9", "1.0"]] and bounded.offset == 20
    assert bounded.read(path)[-1] == ["k1", "END", "0", "2.0"]
