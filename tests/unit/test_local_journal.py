"""``local``'s events journal: a run that ended with exit code 0 keeps no record of its own, and is still known ended.

A hundred thousand ended runs' records were some 16 MiB of the orchestrator's peak; they now share one
(``Journal.settle``). What must hold all the same: the key is still found ended (a ``lookup`` or ``track`` of it
after a restart never starts it again), a failed run keeps what it says, and a line read after the end changes the
key's record only, never the shared one.
"""

from __future__ import annotations

import os
from pathlib import Path

from orch_local.journal import COMPLETED, Journal

from orchestrator.plugin import RunSpec


def append(journal: Journal, *lines: str) -> None:
    with open(journal.events, "a") as f:
        f.writelines(f"{line} 1.0\n" for line in lines)


def test_a_run_ended_with_zero_shares_the_completed_record_and_stays_ended(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    append(journal, "k1 INTENT alice", "k1 START 41", "k1 END 0", "k2 INTENT -", "k2 START 42", "k2 END 3")
    journal.read()
    own = journal.records["k1"]
    assert (own.owner, own.pid, own.ended, own.end_code) == ("alice", 41, True, 0)
    journal.settle("k1")
    journal.settle("k2")
    journal.settle("never-named")
    assert journal.records["k1"] is COMPLETED
    assert journal.record("k1").ended and journal.record("k1").intent_at is not None  # began, ended: not started again
    assert "never-named" not in journal.records
    failed = journal.records["k2"]  # what a failed run says is kept
    assert failed is not COMPLETED and failed.end_code == 3
    journal.close()


def test_a_line_after_the_end_changes_the_key_alone(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    append(journal, "k1 INTENT -", "k1 START 41", "k1 END 0", "k2 INTENT -", "k2 START 42", "k2 END 0")
    journal.read()
    journal.settle("k1")
    journal.settle("k2")
    append(journal, "k1 LOST the wrapper ended without an END line")
    [(key, word, rec)] = journal.read()
    assert (key, word) == ("k1", "LOST") and rec is journal.records["k1"] and rec is not COMPLETED
    assert rec.reason == "the wrapper ended without an END line" and rec.ended
    assert journal.records["k2"] is COMPLETED
    assert (COMPLETED.reason, COMPLETED.end_code, COMPLETED.ended) == (None, 0, True)
    journal.close()


def test_an_owners_file_cannot_touch_a_settled_run(tmp_path: Path) -> None:
    """An owner's events file speaks for that owner's runs only; a settled record names no owner, so none of its
    lines is taken for the run any more."""
    (tmp_path / "events.alice.log").write_text("")
    journal = Journal(tmp_path)
    append(journal, "k1 INTENT alice", "k1 START 41", "k1 END 0")
    journal.read()
    journal.settle("k1")
    (tmp_path / "events.alice.log").write_text("k1 START 99 1.0\nk1 END 7 1.0\n")
    assert journal.read() == []
    assert journal.records["k1"] is COMPLETED and COMPLETED.pid is None
    journal.close()


def test_an_accepted_run_is_read_back_as_it_was_accepted_whatever_its_values(tmp_path: Path) -> None:
    """``submitted.log`` keeps what starting a run needs, for a process that restarts before it started: values
    outside ASCII, and a lone surrogate (a byte that was not UTF-8 in the environment, as ``os.environ`` decodes
    it), are read back the same."""
    jobdir = tmp_path / "jobs" / "3" / "0"
    env = {"GREETING": "grüße\u2028", "RAW": "a\udcffb", "EMPTY": ""}
    specs = [RunSpec(fqid=f"3.{i}", index=i, attempt=1, key=f"k{i}", executable="/bin/echo", args=("é", "two words"),
                     env=env if i else {"PLAIN": "1"}, settings={"shell": "/bin/sh", "n": 2.5}, inputs=(),
                     outputfiles=(), jobdir=jobdir, inputdir=jobdir / "input", outputdir=jobdir / "output",
                     workdir=jobdir / "work", mode="test", retry_count=0, retry_args=("--x",), owner=None)
             for i in range(2)]
    journal = Journal(tmp_path)
    for spec in specs:
        journal.accepted(spec)
    journal.flush_accepted()
    journal.close()
    again = Journal(tmp_path)
    assert again.accepted_specs({"k0", "k1"}) == {"k0": specs[0], "k1": specs[1]}
    again.close()


def test_the_killed_wrappers_an_earlier_process_left_are_those_of_the_first_read(tmp_path: Path) -> None:
    """What the next process looks at (``orch_local.kills``): each KILL line (``KEY KILL PID DEADLINE TIME``), and
    whether its run ended since (a wrapper without an end may still run), as the file was when first read. The
    driver's own later KILL lines are its own to follow, and an owner's file cannot name one."""
    (tmp_path / "events.alice.log").write_text("k4 KILL 9.0 1.0\n")
    journal = Journal(tmp_path)
    append(journal, "k1 INTENT -", "k1 KILL 41 7.5", "k2 INTENT -", "k2 LAUNCH 42", "k2 KILL 42 8.0",
           "k2 LOST killed", "k3 INTENT -", "k3 KILL 43 soon", "k4 INTENT alice")
    journal.read()
    assert [(key, rec.pid, rec.kill_by, rec.ended) for key, rec in journal.take_kills()] == [
        ("k1", 41, 7.5, False), ("k2", 42, 8.0, True)]
    assert journal.records["k3"].kill_by is None
    assert journal.records["k4"].kill_by is None
    append(journal, "k5 INTENT -", "k5 KILL 45 9.5")
    journal.read()
    assert journal.records["k5"].kill_by == 9.5
    assert journal.take_kills() == []
    journal.close()


def test_numbers_a_run_may_write_in_an_events_file_are_taken_only_when_they_are_numbers(tmp_path: Path) -> None:
    """An owner's runs write their START and END lines in a file of the owner's, where the owner may write anything:
    a number ``isdigit`` takes and ``int`` refuses ('²', and ``--5`` once ``-`` is stripped) raised where the file
    was read, which stopped the driver, then every later process (``test_owner_local``, the service). Such a word,
    and a pid of 0 or below (process groups, to ``kill``), now says nothing; the rest of the line still counts."""
    (tmp_path / "events.alice.log").write_text("")
    journal = Journal(tmp_path)
    append(journal, "k1 INTENT alice", "k2 INTENT alice", "k3 INTENT alice", "k4 INTENT - nan")
    journal.read()
    (tmp_path / "events.alice.log").write_text(
        "k1 START \u00b2 1.0\nk1 END --5 1.0\nk2 START 0 1.0\nk2 END \u0663 1.0\n"
        "k3 START -7 1.0\nk3 END -9 1.0\nk1 START 41 1.0\n")
    journal.read()
    k1, k2, k3, k4 = (journal.records[k] for k in ("k1", "k2", "k3", "k4"))
    assert (k1.pid, k1.started, k1.ended, k1.end_code) == (41, True, True, None)
    assert (k2.pid, k2.ended, k2.end_code) == (None, True, None)
    assert (k3.pid, k3.end_code) == (None, -9)
    assert k4.intent_at is not None and k4.intent_at > 1e9  # not nan: the time it was read
    journal.close()


def test_an_owners_file_is_read_whole_a_part_at_a_time(tmp_path: Path) -> None:
    """An owner may fill their file with lines of no run of theirs; it is read a part at a time (those lines
    dropped before the next part), and all of it: a run's END past the first part is still its END (a restart
    that missed it would fail a completed run as lost)."""
    journal = Journal(tmp_path)
    append(journal, "k1 INTENT alice")
    journal.read()
    journal.owner_events("alice", os.getuid(), os.getgid())
    with open(tmp_path / "events.alice.log", "ab") as f:
        f.write(b"k1 START 41 1.0\n")
        line = b"other START 1 1.0 " + b"x" * 1000 + b"\n"
        f.write(line * (20 * 1024 * 1024 // len(line)))  # 20 MiB: more than one part
        f.write(b"k1 END 0 2.0\n")
    assert [(key, word) for key, word, _ in journal.read()] == [("k1", "START"), ("k1", "END")]
    assert journal.records["k1"].ended and journal.records["k1"].end_code == 0
    journal.close()
