"""How much of a run's log is read and kept. A run writes its log as it likes: one of millions of lines took the
service seconds of CPU and gigabytes of memory at each end, its keywords carried with its report and stored. Of a
log over a MiB its first 64 KiB and its last MiB are read; of its keyword lines, the first terminal ones and the
last of the others are kept."""

from __future__ import annotations

from pathlib import Path

from orchestrator.core.runlog import MAX_KEYWORDS, MAX_TERMINAL, parse_log
from orchestrator.plugin.wrapper import LOG_HEAD, LOG_READ, read_log


def test_a_floods_keywords_are_kept_to_the_first_terminal_and_the_last_others() -> None:
    lines = ["1.0 START 5 host", "1.5 FAILED early"]
    lines += [f"2.0 INFO line {i}" for i in range(50_000)]
    lines += [f"3.0 SUCCEEDED out{i}" for i in range(MAX_TERMINAL + 5)]
    lines += ["4.0 REFUSED x", "5.0 EXIT 0", "6.0 END 0"]
    log = parse_log("\n".join(lines) + "\n")
    words = [w for _, w, _ in log.keywords]
    assert words.count("FAILED") + words.count("SUCCEEDED") == MAX_TERMINAL  # the first of them: enough to say two
    assert words[0] == "FAILED" and words[-1] == "REFUSED"  # in the log's order
    infos = [d for _, w, d in log.keywords if w == "INFO"]
    assert len(infos) == MAX_KEYWORDS - 1 and infos[-1] == "line 49999"  # the last others (REFUSED is one)
    assert (log.started, log.host, log.exit_code, log.ended, log.end_code) == (1.0, "host", 0, 6.0, 0)


def test_a_log_over_a_mib_is_read_by_its_head_and_its_tail(tmp_path: Path) -> None:
    output = tmp_path / "7" / "output"
    output.mkdir(parents=True)
    body = "".join(f"2.0 INFO {'y' * 90} {i}\n" for i in range(3 * LOG_READ // 100))
    (output / "orch.1.log").write_text(f"1.0 START 42 node7\n{body}3.0 FAILED late one\n4.0 EXIT 3\n5.0 END 3\n")
    assert (output / "orch.1.log").stat().st_size > LOG_READ + LOG_HEAD
    log = read_log(output, 1, fqid="7")
    assert (log.started, log.host, log.exit_code, log.ended, log.end_code) == (1.0, "node7", 3, 5.0, 3)
    assert [w for _, w, _ in log.keywords if w != "INFO"] == ["FAILED"]
    assert all(d.startswith("y" * 90) for _, w, d in log.keywords if w == "INFO")  # no line cut where a read began
