"""The service's log is an observer of the bus (README, "The service": **Log**): one JSON line per request and per
batch of status changes, each with the job's ``fqid`` and the ``stimulus_id``, at the level the service logs; a
large master writes a line per batch, never one per subjob.

A real ``orchestrator serve`` subprocess (stopped by its PID), driven through the CLI; its stdout is what
supervisord keeps as ``service.log``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from served import Service, cli, cli_ok, start


def sim_file(where: Path, name: str, n: int, *, fail: int | None = None) -> Path:
    path = where / f"{name}.toml"
    outcome = f"outcome = {{ {fail} = \"failed\" }}\n" if fail is not None else ""
    values = ", ".join(f'["{i}"]' for i in range(n))
    path.write_text(f'name = "{name}"\n[application]\nexe = "/bin/echo"\n[backend]\nname = "sim"\n'
                    f"run_seconds = 0.1\n{outcome}[splitter]\ntype = \"args\"\nargs = [{values}]\n")
    return path


def log_lines(service: Service) -> list[dict[str, Any]]:
    lines = []
    for raw in service.out.read_text().splitlines():
        if raw.strip():
            lines.append(json.loads(raw))  # every line is JSON
    return lines


def test_a_line_per_request_and_per_batch_of_changes_with_fqid_and_stimulus_id(services: list[Service],
                                                                               tmp_path: Path) -> None:
    home = tmp_path / "home"
    service = start(services, home)
    small = sim_file(tmp_path, "small", 3, fail=1)
    big = sim_file(tmp_path, "big", 20_000)
    assert cli(home, "submit", str(small), "--wait", timeout=120).returncode == 1  # subjob 1 failed
    cli_ok(home, "submit", str(big), "--wait", timeout=300)
    code, _ = service.terminate()
    assert code == 0
    lines = log_lines(service)
    status = [x for x in lines if x.get("event") == "status"]
    requests = [x for x in lines if x.get("event") == "request"]
    assert all(x["level"] == "info" and x.get("stimulus_id") for x in status + requests), status + requests

    # job 0: three subjobs on sim, subjob 1 fails; each line names the job (or the one run) and its stimulus
    submit = next(x for x in requests if x["type"] == "SubmitRequested" and x["fqid"] == "0")
    of_small = [x for x in status if x["fqid"] == "0" or x["fqid"].startswith("0.")]
    assert any(x["stimulus_id"] == submit["stimulus_id"] and x["new"] == "submitting" and x.get("subjobs") == "0-2"
               and x["runs"] == 3 for x in of_small), of_small
    assert any(x["fqid"] == "0.1" and x["new"] == "failed" for x in of_small), of_small
    assert any(x["fqid"] == "0" and "subjobs" not in x and x["new"] == "failed" for x in of_small), of_small
    ended = {x["fqid"] for x in of_small if x["new"] == "completed"} | \
        {f"0.{i}" for x in of_small if x["new"] == "completed" and "subjobs" in x
         for i in _indexes(x["subjobs"])}
    assert {"0.0", "0.2"} <= ended, of_small

    # job 1: 20,000 subjobs: every one is in a line's batch, and the lines are batches, not one per subjob
    of_big = [x for x in status if x["fqid"] == "1" or x["fqid"].startswith("1.")]
    runs = [x for x in of_big if "subjobs" in x or "." in x["fqid"]]  # not the master's own (derived) status
    completed = sum(x.get("runs", 1) for x in runs if x["new"] == "completed")
    assert completed == 20_000, completed
    assert len(of_big) < 2_000, len(of_big)


def _indexes(text: str) -> list[int]:
    out: list[int] = []
    for piece in text.split(","):
        lo, _, hi = piece.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out
