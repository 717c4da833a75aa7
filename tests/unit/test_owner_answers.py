"""What the service takes from the processes it runs as a job's owner, and from the files of a run: each is the
owner's to write, and what is no answer says nothing (``docs/reference.md``, "What a run writes is read with
limits")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from orch_local.journal import Record
from orch_local.runs import Run, logged_pid

from orchestrator.runtime.postrun import read_answer


@pytest.mark.parametrize("last", [b'{"error": null, "failed_subjobs": [[Infinity, "x"]]}',
                                  b'{"error": null, "failed_subjobs": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                                  b'{"error": null, "failed_subjobs": [["1e400", "x"]]}', b"[]", b"", b"nonsense"])
def test_an_owners_answer_that_is_no_answer_says_so(last: bytes) -> None:
    """An ``Infinity`` (``OverflowError``) and nesting deeper than Python recurses (``RecursionError``) went past
    the handler, which took four kinds of error: the master never ended."""
    assert read_answer(b"prints of the user's code\n" + last + b"\n", {0, 1}) is None


def test_an_owners_answer_names_known_subjobs_only() -> None:
    got = read_answer(b'\n{"error": null, "failed_subjobs": [[1, "bad"], [7, "no such"], [-1, "nor"]]}\n', {0, 1})
    assert got is not None and got.error is None and got.failed_subjobs == [(1, "bad")]


def test_a_pid_a_run_writes_in_its_log_is_taken_only_as_a_pid(tmp_path: Path) -> None:
    """After a restart a hosted run's program is known by the last ``START`` pid of its log, a file the run may
    write: a pid of 5,000 digits raised in ``int`` (past 4,300) at every start; ``0`` and ``-1`` are groups."""
    out = tmp_path / "1" / "output"
    out.mkdir(parents=True)
    log = out / "orch.1.log"
    run = Run("k", "1", "/bin/sh", str(tmp_path / "1"), Record(), joblog=str(log))
    log.write_text("1.0 START 41 h\n2.0 START " + "9" * 5000 + " h\n"
                   "3.0 START 0 h\n4.0 START -1 h\n5.0 START \u00b2 h\n")
    assert logged_pid(run) == 41


def test_an_owners_answers_reasons_are_kept_to_16_kib() -> None:
    """They are stored with the master's and its subjobs' records, as a run's keyword data is (kept to 16 KiB)."""
    long = "x" * (1 << 20)
    got = read_answer(b"\n" + json.dumps({"error": long, "failed_subjobs": [[0, long]]}).encode() + b"\n", {0})
    assert got is not None and got.error == long[:16 << 10] and got.failed_subjobs == [(0, long[:16 << 10])]
