"""The home's SQLite files under harm: a damaged repository is named, not a traceback; ``orchestrator backup``
copies a live home; a SIGTERM while a write waits for the database lock exits 0 with everything whole.

Through the CLI (subprocesses), ``Orchestrator(home=...)``, and real service processes (``served.Service``).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from served import STOP_LIMIT, Service, cli, cli_ok, start
from test_service_lifecycle import sim_file

from orchestrator import Orchestrator, RepositoryError
from orchestrator.cli.jobfile import load_job

REPO = "repository.sqlite"


# ------------------------------------------------------------------ helpers
def home_with_jobs(home: Path, tmp_path: Path, n: int = 2) -> list[str]:
    """A home (no service) with ``n`` sim jobs of 3 subjobs submitted; their ids."""
    return [cli_ok(home, "submit", str(sim_file(tmp_path, name=f"sim{i}", n=3))).split()[0] for i in range(n)]


def listing(home: Path) -> dict[str, tuple[str, str, int]]:
    """fqid -> (name, status, subjobs), read through the public API."""
    async def read() -> dict[str, tuple[str, str, int]]:
        async with Orchestrator(home=home) as orch:
            return {j.fqid: (j.name, j.status.value, len(j.subjobs)) for j in orch.jobs.select()}
    return anyio.run(read)


def damage(path: Path, how: str) -> None:
    """Garbage over the header, a file of random bytes, or garbage over the ``jobs`` table's root page."""
    if how == "header":
        with open(path, "r+b") as f:
            f.write(os.urandom(4096))
    elif how == "random":
        path.write_bytes(os.urandom(64 * 1024))
    else:
        db = sqlite3.connect(path)
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name='jobs'").fetchone()[0]
        db.close()
        with open(path, "r+b") as f:
            f.seek((root - 1) * page_size)
            f.write(os.urandom(page_size))
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def assert_clear(result: subprocess.CompletedProcess[str], path: Path) -> None:
    """Refused with the documented exit code and a message naming the file, what SQLite said, what to do."""
    out = result.stdout + result.stderr
    assert result.returncode == 2, (result.returncode, out)
    assert "Traceback" not in out, out
    message = " ".join(result.stderr.split())  # the console may wrap a long line
    assert f"{path} is damaged" in message, message
    assert "SQLite says" in message and ("not a database" in message or "malformed" in message), message
    assert "orchestrator backup" in message and ".recover" in message and "move it aside" in message, message


# ------------------------------------------------------------------ item 3: a damaged repository
@pytest.mark.parametrize("how", ["header", "random", "page"])
def test_a_damaged_repository_is_named_and_left_as_it_is(tmp_path: Path, how: str) -> None:
    home = tmp_path / "home"
    home_with_jobs(home, tmp_path, n=1)
    repo = home / REPO
    damage(repo, how)
    before = repo.read_bytes()

    assert_clear(cli(home, "jobs", timeout=30), repo)
    assert_clear(cli(home, "serve", timeout=30), repo)  # the service refuses to start
    with pytest.raises(RepositoryError) as caught:
        listing(home)
    assert caught.value.path == str(repo) and f"{repo} is damaged" in str(caught.value)

    assert repo.read_bytes() == before, "the damaged file must be left exactly as it was"
    assert not (tmp_path / "copy").exists()
    refused = cli(home, "backup", str(tmp_path / "copy"), timeout=30)
    assert_clear(refused, repo)
    assert not (tmp_path / "copy").exists(), "a failed backup leaves no directory behind"


def test_a_damaged_workflow_store_stops_the_service_from_starting(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home_with_jobs(home, tmp_path, n=1)
    store = home / "workflows.sqlite"
    store.write_bytes(os.urandom(8192))
    result = cli(home, "serve", timeout=30)
    assert_clear(result, store)
    assert "service ready" not in result.stdout, "it must refuse before it says it is ready"


# ------------------------------------------------------------------ item 3: orchestrator backup
def test_backup_of_a_home_opens_as_a_home_with_the_same_jobs(tmp_path: Path) -> None:
    home, copy = tmp_path / "home", tmp_path / "backups" / "monday"
    ids = home_with_jobs(home, tmp_path, n=2)
    original = listing(home)
    assert set(original) == set(ids)

    out = cli_ok(home, "backup", str(copy))
    assert f"{home / REPO} -> {copy / REPO}: 2 jobs" in out and "quick_check ok" in out, out
    assert sorted(p.name for p in copy.iterdir()) == [REPO], "one self-contained file, no -wal beside it"
    assert listing(copy) == original

    # An existing backup is refused without --force, replaced with it.
    again = cli(home, "backup", str(copy))
    assert again.returncode == 2 and f"{copy / REPO} exists" in again.stderr and "--force" in again.stderr
    assert "Traceback" not in again.stderr
    cli_ok(home, "submit", str(sim_file(tmp_path, name="third", n=2)))
    assert "3 jobs" in cli_ok(home, "backup", str(copy), "--force")
    assert len(listing(copy)) == 3
    # Not into a file, not over the home itself; --help says what it does.
    (tmp_path / "afile").write_text("x")
    for where, says in ((tmp_path / "afile", "is not a directory"), (home, "is the home itself")):
        refused = cli(home, "backup", str(where))
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr
    assert "online backup API" in " ".join(cli_ok(home, "backup", "--help").split())


def test_backup_while_a_service_writes_the_home(services: list[Service], tmp_path: Path) -> None:
    home, copy = tmp_path / "home", tmp_path / "copy"
    service = start(services, home)
    busy = cli_ok(home, "submit", str(sim_file(tmp_path, name="busy", n=300, run_seconds=0.5))).split()[0]
    copies = []
    for k in range(3):  # while the 300 runs start, end and are written
        target = copy / str(k)
        out = cli_ok(home, "backup", str(target))
        assert "quick_check ok" in out and f"{target / 'workflows.sqlite'}" in out, out
        copies.append(target)
        time.sleep(0.3)
    cli_ok(home, "wait", busy, "--timeout", "60")
    with service.client() as c:
        assert c.get("/health").status_code == 200, "the service goes on undisturbed"
    for target in copies:
        jobs = listing(target)
        assert jobs[busy][:1] == ("busy",) and jobs[busy][2] == 300, jobs
    assert service.terminate()[0] == 0, service.output()


# ------------------------------------------------------------------ item 20: SIGTERM during a write
def post(service: Service, method: str, body: dict[str, Any], answers: dict[str, Any]) -> threading.Thread:
    """POST in a thread of its own (it may block on the database); what came back lands in ``answers``."""
    def go() -> None:
        try:
            with service.client() as c:
                answers[method] = c.post(f"/api/{method}", json=body, timeout=30).status_code
        except Exception as exc:  # the service stopped before answering: fine, nothing was promised
            answers[method] = repr(exc)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


def stopped_cleanly(service: Service) -> None:
    proc = service.proc_()
    try:
        code = proc.wait(2 * STOP_LIMIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"no exit {2 * STOP_LIMIT:g} s after SIGTERM\n{service.output()}") from None
    out = service.output()
    assert code == 0, out
    assert "Traceback" not in out and '"level": "error"' not in out, out


def whole(home: Path, n: int) -> dict[str, tuple[str, str, int]]:
    """Every job reopened is consistent: new without subjobs, or split into all ``n`` with none failed."""
    jobs = listing(home)
    for fqid, (_name, status, subjobs) in jobs.items():
        assert (status, subjobs) == ("new", 0) or (subjobs == n and status in ("submitted", "running")), \
            (fqid, status, subjobs)
    return jobs


def test_sigterm_while_writes_wait_for_the_database_lock(services: list[Service], tmp_path: Path) -> None:
    home = tmp_path / "home"
    spec = load_job(sim_file(tmp_path, name="held", n=4)).spec()
    service = start(services, home)
    with service.client() as c:
        job = c.post("/api/add", json={"name": "held", "spec": spec}).json()["fqid"]
    lock = sqlite3.connect(home / REPO, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")  # every write of the service now waits for this
    try:
        answers: dict[str, Any] = {}
        threads = [post(service, "add", {"name": "late", "spec": spec}, answers)]
        time.sleep(0.2)
        threads.append(post(service, "submit", {"fqid": job}, answers))
        time.sleep(0.5)
        service.proc_().send_signal(signal.SIGTERM)
        time.sleep(3)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    stopped_cleanly(service)
    for thread in threads:
        thread.join(30)
    jobs = whole(home, 4)
    assert job in jobs and jobs[job][0] == "held"
    assert set(jobs) <= {job, str(int(job) + 1)}


def test_sigterm_early_in_a_large_submit(services: list[Service], tmp_path: Path) -> None:
    spec = load_job(sim_file(tmp_path, name="big", n=600)).spec()
    for attempt in range(5):
        home = tmp_path / f"home{attempt}"
        service = start(services, home)
        with service.client() as c:
            job = c.post("/api/add", json={"name": "big", "spec": spec}).json()["fqid"]
        answers: dict[str, Any] = {}
        thread = post(service, "submit", {"fqid": job}, answers)
        time.sleep(0.05)
        service.proc_().send_signal(signal.SIGTERM)
        stopped_cleanly(service)
        thread.join(30)
        assert whole(home, 600)[job][0] == "big", attempt
