"""``jobs`` and ``show`` answer as sacct does: fixed, documented columns, local clock times, ``--format`` over the
fields sacct users reach for (start, end, elapsed, state, exit code, attempts, backend id, host, reason), and
``--json`` adding fields, never renaming one."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

EXE = str(Path(sys.executable).with_name("orchestrator"))
CLOCK = r"\d\d:\d\d:\d\d"


def cli(home: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([EXE, "--home", str(home), *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == code, (args, done.returncode, done.stdout, done.stderr)
    return done


def test_show_has_sacct_columns_and_format_picks_them(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = tmp_path / "three.toml"
    job.write_text('name = "three"\n[application]\nexe = "/bin/sh"\n[backend]\nname = "local"\n'
                   '[splitter]\ntype = "args"\nargs = [["-c", "exit 0"], ["-c", "echo oops >&2; exit 4"], '
                   '["-c", "sleep 60"]]\n')
    fqid = cli(home, "submit", str(job)).stdout.strip()
    cli(home, "wait", f"{fqid}", "--timeout", "5", code=1)  # two end, the third hangs
    shown = cli(home, "show", fqid).stdout.splitlines()
    header = next(line for line in shown if line.startswith("id "))
    assert header.split() == ["id", "status", "args", "start", "end", "elapsed", "exit", "attempts", "host",
                              "backend_id", "reason"]
    picked = cli(home, "show", fqid, "--all", "--format", "jobid,state,start,end,elapsed,exitcode,host").stdout
    rows = {line.split()[0]: line.split() for line in picked.splitlines() if line.startswith(f"{fqid}.")}
    host = socket.gethostname().split(".")[0]
    ok, bad, hung = rows[f"{fqid}.0"], rows[f"{fqid}.1"], rows[f"{fqid}.2"]
    assert ok[1] == "completed" and re.fullmatch(CLOCK, ok[2]) and re.fullmatch(CLOCK, ok[3]) and ok[5] == "0"
    assert bad[1] == "failed" and bad[5] == "4" and bad[6].split(".")[0] == host
    # the hung one: started, no end, and its elapsed time growing from its start
    assert hung[1] == "running" and re.fullmatch(CLOCK, hung[2]) and hung[3] == "-" and hung[4].endswith("s")
    # history times as local clock times, never raw epoch seconds
    history = cli(home, "show", f"{fqid}.1").stdout
    assert re.search(rf"time={CLOCK}", history) and not re.search(r"time=\d{9,}", history)
    # --json adds the fields, renames none
    rows_json = {r["fqid"]: r for r in json.loads(cli(home, "show", fqid, "--json").stdout)["subjob_rows"]}
    assert {"fqid", "status", "args", "submits", "backend_id", "reason", "started_at", "ended_at", "host",
            "exit_code"} <= set(rows_json[f"{fqid}.1"])
    assert rows_json[f"{fqid}.1"]["exit_code"] == 4 and rows_json[f"{fqid}.0"]["host"].split(".")[0] == host
    refused = cli(home, "show", fqid, "--format", "jobid,exitcod", code=2)
    assert "unknown field 'exitcod'" in refused.stderr and "exitcode" in refused.stderr
    cli(home, "kill", f"{fqid}.2")


def test_jobs_format_picks_columns(tmp_path: Path) -> None:
    home = tmp_path / "home"
    job = tmp_path / "sim.toml"
    job.write_text('name = "sims"\n[application]\nexe = "/bin/true"\n[backend]\nname = "sim"\nrun_seconds = 0.1\n'
                   '[splitter]\ntype = "args"\nrange = "0-4"\n')
    fqid = cli(home, "submit", str(job), "--wait").stdout.split()[0]
    out = cli(home, "jobs", "--format", "jobid,state,subjobs,completed,submit,end,elapsed").stdout.splitlines()
    assert out[0].split() == ["id", "status", "subjobs", "completed", "submit", "end", "elapsed"]
    row = out[1].split()
    assert row[:4] == [fqid, "completed", "5", "5"] and re.fullmatch(CLOCK, row[4]) and re.fullmatch(CLOCK, row[5])
