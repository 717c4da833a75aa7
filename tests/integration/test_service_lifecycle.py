"""``orchestrator serve`` as a real process: SIGTERM persists and a restart reattaches, a second service on
the same home is refused, and the control API answers bad requests clearly.

Each service is a subprocess of the installed ``orchestrator`` command, stopped by its PID at teardown.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from served import ORCH, STOP_LIMIT, Service, cli_ok, start
from stored import jobs_and_subjobs

from orchestrator.api.client import ServiceClient
from orchestrator.cli.jobfile import load_job
from orchestrator.core.errors import JobError, UnknownJobError


def sim_file(where: Path, *, name: str = "simjob", n: int = 4, run_seconds: float = 600.0) -> Path:
    path = where / f"{name}.toml"
    values = ", ".join(f'["{i}"]' for i in range(n))
    path.write_text(f'name = "{name}"\n[application]\nexe = "/bin/echo"\n[backend]\nname = "sim"\n'
                    f"run_seconds = {run_seconds}\n[splitter]\ntype = \"args\"\nargs = [{values}]\n")
    return path


def job_rows(listing: str) -> dict[str, list[str]]:
    """``orchestrator jobs`` output: id -> the row's columns but the owner (checked: this user)."""
    lines = listing.splitlines()
    assert lines and lines[0].split()[:6] == ["id", "name", "owner", "status", "backend", "subjobs"], listing
    rows = {line.split()[0]: line.split() for line in lines[1:] if line.strip() and line.split()[1:2] != ["jobs"]}
    me = pwd.getpwuid(os.getuid()).pw_name
    assert all(row[2] == me for row in rows.values()), listing
    return {job: row[:2] + row[3:] for job, row in rows.items()}



# ------------------------------------------------------------------ (c) SIGTERM, then a restart reattaches
LOCAL_N = 50
ALLOWED_WHILE_ACTIVE = {"submitted", "running", "completed"}


def derived_master_status(statuses: list[str]) -> str:
    """docs/design.md's master rules, submitted-first."""
    present = set(statuses)
    for wanted, result in ((("submitted", "submitting"), "submitted"), (("running", "completing"), "running"),
                           (("held",), "held"), (("failed", "new"), "failed"), (("completed",), "completed")):
        if present.intersection(wanted):
            return result
    return "killed"


def stored(home: Path) -> tuple[dict[int, str], dict[int, dict[int, tuple[str, dict[str, Any]]]]]:
    """The repository as a stopped service left it: job id -> status; master -> idx -> (status, info)."""
    return jobs_and_subjobs(home)


def ran_indexes(path: Path) -> list[int]:
    return sorted(int(line) for line in path.read_text().split()) if path.exists() else []


def test_sigterm_persists_and_a_restart_reattaches(services: list[Service], tmp_path: Path) -> None:
    home = tmp_path / "home"
    ran = tmp_path / "ran.txt"
    script = f'sleep "$2"; echo "$1" >> {ran}'
    # A JSON array of strings is a TOML array; each subjob sleeps 0.5 to 8 s, then appends its index: a window of
    # seconds in which some ended and some run, however slowly a loaded host answers the polls below.
    args = ", ".join(json.dumps(["-c", script, "sh", str(i), str(0.5 + (i % 4) * 2.5)]) for i in range(LOCAL_N))
    local_file = tmp_path / "sleepers.toml"
    local_file.write_text(f'name = "sleepers"\n[application]\nexe = "/bin/sh"\n[backend]\nname = "local"\n'
                          f'[splitter]\ntype = "args"\nargs = [{args}]\n')
    service = start(services, home)
    local_id = cli_ok(home, "submit", str(local_file)).split()[0]
    sim_id = cli_ok(home, "submit", str(sim_file(tmp_path, name="simmed", n=20, run_seconds=12.0))).split()[0]

    # SIGTERM once the short runs have ended and the long ones are still going.
    with service.client() as c:
        deadline = time.monotonic() + 30
        while True:
            counts = {j["fqid"]: j["counts"] for j in c.post("/api/jobs", json={}).json()}
            if counts[local_id].get("completed") and counts[local_id].get("running"):
                break
            assert time.monotonic() < deadline, f"the local job never ran: {counts}"
            time.sleep(0.05)
    assert counts[sim_id].keys() <= {"submitted", "running"}, counts

    # A client following the event stream must not hold the service up.
    streaming = threading.Event()

    def follow() -> None:
        try:
            with service.client() as c, c.stream("GET", "/api/events") as events:
                for _line in events.iter_lines():
                    streaming.set()
        except httpx.HTTPError:
            pass

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert streaming.wait(10)
    code, seconds = service.terminate()
    assert code == 0, service.output()
    assert seconds < STOP_LIMIT, f"took {seconds:.1f} s to stop"
    follower.join(10)
    assert not follower.is_alive()
    assert not service.socket.exists() and not (home / "service" / "service.json").exists()

    # What it left: nothing transient, nothing failed, masters derived from their subjobs, no invented completion.
    done_before = set(ran_indexes(ran))
    jobs, subjobs = stored(home)
    assert set(jobs) == {int(local_id), int(sim_id)}
    assert len(subjobs[int(local_id)]) == LOCAL_N and len(subjobs[int(sim_id)]) == 20
    for master, by_idx in subjobs.items():
        statuses = [s for s, _info in by_idx.values()]
        assert set(statuses) <= ALLOWED_WHILE_ACTIVE, (master, sorted(set(statuses)))
        assert jobs[master] == derived_master_status(statuses), (master, jobs[master], sorted(set(statuses)))
    completed_local = {i for i, (s, _info) in subjobs[int(local_id)].items() if s == "completed"}
    assert completed_local <= done_before
    assert jobs[int(local_id)] in ("submitted", "running"), "SIGTERM came too late to test anything"

    # Restart: the runs that went on meanwhile are found again, and everything completes.
    service = start(services, home)
    cli_ok(home, "wait", local_id, "--timeout", "60")
    cli_ok(home, "wait", sim_id, "--timeout", "60")
    assert ran_indexes(ran) == list(range(LOCAL_N)), "every local subjob must run exactly once"
    rows = job_rows(cli_ok(home, "jobs"))
    assert rows[local_id][1:6] == ["sleepers", "completed", "local", str(LOCAL_N), str(LOCAL_N)]
    assert rows[sim_id][1:6] == ["simmed", "completed", "sim", "20", "20"]
    code, seconds = service.terminate()
    assert code == 0 and seconds < STOP_LIMIT, service.output()
    jobs, subjobs = stored(home)
    assert jobs == {int(local_id): "completed", int(sim_id): "completed"}
    for rows_of in subjobs.values():
        assert {s for s, _info in rows_of.values()} == {"completed"}
        assert {info["submit_counter"] for _s, info in rows_of.values()} == {1}, "a subjob was resubmitted"


#: ``orchestrator serve`` on ``sys.argv[1]`` with a ``sim`` backend that hangs on every automatic retry.
HANGING_RETRY_SERVICE = """
import sys

import anyio
import orch_sim

from orchestrator.cli import main

plain = orch_sim.SimDriver.submit_bulk


async def submit_bulk(self, runs):
    if any(run.attempt > 1 for run in runs):
        print("a retry's submission hangs", flush=True)
        await anyio.sleep(3600)
    return await plain(self, runs)


orch_sim.SimDriver.submit_bulk = submit_bulk
sys.argv = ["orchestrator", "--home", sys.argv[1], "serve"]
main()
"""


def test_sigterm_stops_in_time_while_a_retry_hangs_at_the_backend(services: list[Service], tmp_path: Path) -> None:
    """Closing a home waits core.close_grace (60 s) for retries under way; the service must not."""
    home = tmp_path / "home"
    service = start(services, home, argv=[sys.executable, "-c", HANGING_RETRY_SERVICE, str(home)])
    job_file = tmp_path / "retried.toml"
    job_file.write_text('name = "retried"\n[application]\nexe = "/bin/echo"\n[backend]\nname = "sim"\n'
                        'run_seconds = 0.1\noutcome = { 0 = ["failed", "completed"] }\n'
                        '[splitter]\ntype = "args"\nargs = [["0"], ["1"]]\n[retry]\nmax_early = 1\n')
    job_id = cli_ok(home, "submit", str(job_file)).split()[0]
    deadline = time.monotonic() + 20
    while "a retry's submission hangs" not in service.out.read_text():
        assert time.monotonic() < deadline, service.output()
        time.sleep(0.05)
    code, seconds = service.terminate()
    assert code == 0, service.output()
    assert seconds < STOP_LIMIT, f"took {seconds:.1f} s to stop"
    jobs, subjobs = stored(home)
    # The retry cut short is written ahead (submitting, with its key); the next start settles it.
    assert [s for s, _info in subjobs[int(job_id)].values()] == ["submitting", "completed"]
    start(services, home)
    assert "completed: 2/2 final" in cli_ok(home, "wait", job_id, "--timeout", "30")


# ------------------------------------------------------------------ (d) one service per home
def test_a_second_service_on_the_same_home_is_refused(shared: Service, tmp_path: Path) -> None:
    second = subprocess.run([str(ORCH), "--home", str(shared.home), "serve"], capture_output=True, text=True,
                            timeout=30, stdin=subprocess.DEVNULL)
    assert second.returncode != 0
    assert "in use by the orchestrator service" in second.stderr and f"pid {shared.pid}" in second.stderr, \
        second.stderr
    assert "Traceback" not in second.stderr
    # The first one is untouched: same socket, same description, still answering.
    assert shared.proc_().poll() is None
    assert json.loads((shared.home / "service" / "service.json").read_text())["pid"] == shared.pid
    with shared.client() as c:
        assert c.get("/health").json()["pid"] == shared.pid

    # Meanwhile the CLI goes through the service (opening the home itself would be refused by its lock).
    job_id = cli_ok(shared.home, "submit", str(sim_file(tmp_path, name="via-cli", n=3))).split()[0]
    row = job_rows(cli_ok(shared.home, "jobs"))[job_id]
    assert row[1] == "via-cli" and row[2] in ("submitted", "running"), row
    with shared.client() as c:
        assert job_id in [j["fqid"] for j in c.post("/api/jobs", json={}).json()]
    assert f"job {job_id}: killed" in cli_ok(shared.home, "kill", job_id)


# ------------------------------------------------------------------ (e) bad requests
def test_bad_requests_get_clear_answers(shared: Service, tmp_path: Path) -> None:
    with shared.client() as c:
        added = c.post("/api/add", json={"name": "busy",
                                         "spec": load_job(sim_file(tmp_path, name="busy", n=2)).spec()})
        assert added.status_code == 200, added.text
        job_id = added.json()["fqid"]
        assert c.post("/api/submit", json={"fqid": job_id}).status_code == 200

        def answer(method: str, path: str, status: int, error: str, **kw: Any) -> dict[str, Any]:
            r = c.request(method, path, **kw)
            assert r.status_code == status, (method, path, kw, r.status_code, r.text)
            body = r.json()
            assert body["error"] == error, body
            return dict(body)

        # unknown method or route: 404
        assert "nosuch" in answer("POST", "/api/nosuch", 404, "not found", json={})["message"]
        answer("POST", "/api/job", 404, "not found", json={"fqid": job_id})  # Control.job is not exposed
        answer("POST", "/api/__init__", 404, "not found", json={})
        answer("GET", "/nowhere", 404, "not found")
        # not JSON, or not an object: 400
        as_json = {"content-type": "application/json"}
        assert "not JSON" in answer("POST", "/api/jobs", 400, "bad request", content=b"{not json",
                                    headers=as_json)["message"]
        answer("POST", "/api/jobs", 400, "bad request", content=b"\xff\xfe", headers=as_json)
        # a POST that does not say it is JSON (a form could send it from any page): 415
        answer("POST", "/api/jobs", 415, "unsupported media type", content=b"{}",
               headers={"content-type": "text/plain"})
        answer("POST", "/api/jobs", 400, "bad request", json=[job_id])
        # arguments that do not fit: 400, naming the argument
        assert "bogus" in answer("POST", "/api/jobs", 400, "bad request", json={"bogus": 1})["message"]
        assert "fqid" in answer("POST", "/api/show", 400, "bad request", json={})["message"]
        # a method that changes things is not a GET
        answer("GET", "/api/submit", 405, "method not allowed", params={"fqid": job_id})
        # unknown job: 404, naming it
        for fqid in ("999", f"{job_id}.77", "not-an-id"):
            missing = answer("POST", "/api/show", 404, "unknown job", json={"fqid": fqid})
            assert missing["fqid"] == fqid and fqid in missing["message"]
        answer("GET", "/api/show", 404, "unknown job", params={"fqid": "999"})
        # refused: 409, naming the job
        for method in ("remove", "submit"):
            refused = answer("POST", f"/api/{method}", 409, "refused", json={"fqid": job_id})
            assert refused["fqid"] == job_id and f"job {job_id}" in refused["message"], refused

    async def via_client() -> None:  # the client turns them back into the same exceptions
        async with ServiceClient(socket=shared.socket) as client:
            with pytest.raises(UnknownJobError, match="no job 999"):
                await client.show(fqid="999")
            with pytest.raises(JobError) as refused:
                await client.remove(fqid=job_id)
            assert refused.value.fqid == job_id
            await client.kill(fqid=job_id)

    anyio.run(via_client)
