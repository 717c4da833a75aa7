"""The service's request boundary (issue 22): every request is decoded into a typed request before anything
runs; one that does not fit answers 400 naming the field, never 5xx, and stores nothing; a broken definition
already stored never stops the service.

Each test runs a real ``orchestrator serve`` subprocess and talks to it over its Unix socket (or through the
CLI and the Python API), stopped by its PID at teardown.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from served import Service, cli, cli_ok, start

from orchestrator import Executable, Job, JobError, Orchestrator
from orchestrator.api import wire
from orchestrator.api.client import ServiceClient

SPEC = {"application": {"exe": "/bin/echo", "args": ["x"]}, "backend": {"name": "sim", "settings": {}}}


def snapshot(c: httpx.Client) -> dict[int, Any]:
    """Every job as the service describes it: name, definition, status (what a refused request must not
    change)."""
    answer = c.post("/api/describe", json={})
    assert answer.status_code == 200, answer.text
    return {j["id"]: (j["name"], j["spec"], j["status"], j["owner"]) for j in answer.json()["jobs"]}


def added(c: httpx.Client, name: str = "plain", spec: dict[str, Any] = SPEC) -> str:
    answer = c.post("/api/add", json={"name": name, "spec": spec})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["fqid"])


def refused(c: httpx.Client, method: str, path: str, **kw: Any) -> dict[str, Any]:
    """The request answers 400 ``bad request`` with the error's fields, and the service serves on."""
    answer = c.request(method, path, **kw)
    assert answer.status_code == 400, (method, path, answer.status_code, answer.text)
    body = answer.json()
    assert body["error"] == "bad request" and set(body) >= {"message", "field", "fqid"}, body
    assert "Traceback" not in body["message"]
    assert c.get("/health").status_code == 200
    return dict(body)


def test_submit_with_an_internal_definition_is_refused_and_the_service_restarts(
        services: list[Service], tmp_path: Path) -> None:
    service = start(services, tmp_path / "home")
    with service.client() as c:
        job = added(c)
        before = snapshot(c)
        # The request of the issue: a definition as internal structures, and one that lacks its backend.
        body = refused(c, "POST", "/api/submit", json={"fqid": job, "definitions": {job: ["d", {}]}})
        assert body["field"] == f"definitions.{job}" and body["fqid"] == job, body
        body = refused(c, "POST", "/api/submit", json={"fqid": job, "definitions": {job: {"name": "d", "spec": {}}}})
        assert body["field"].startswith(f"definitions.{job}.spec."), body
        assert snapshot(c) == before  # nothing stored
        assert c.get("/api/jobs").status_code == 200 and c.get("/").status_code == 200
    code, _seconds = service.terminate()
    assert code == 0, service.output()
    again = start(services, service.home)
    listing = cli(again.home, "jobs")
    assert listing.returncode == 0 and "Traceback" not in listing.stderr + listing.stdout, listing
    assert "plain" in listing.stdout and "new" in listing.stdout
    with again.client() as c:
        assert snapshot(c) == before


def test_mistyped_and_unknown_fields_answer_400_naming_them(services: list[Service], tmp_path: Path) -> None:
    service = start(services, tmp_path / "home")
    with service.client() as c:
        job = added(c)
        before = snapshot(c)
        body = refused(c, "POST", "/api/annotate", json={"job": int(job), "metadata": ["a", "list"]})
        assert body["field"] == "metadata" and body["fqid"] == job, body
        refused(c, "POST", "/api/annotate", json={"job": int(job), "comment": {"not": "text"}})
        body = refused(c, "POST", "/api/wait", json={"fqid": job, "timeout": "x"})
        assert body["field"] == "timeout" and body["fqid"] == job, body
        body = refused(c, "POST", "/api/kill", json={"fqid": job, "bogus": 1})
        assert body["field"] == "bogus" and "bogus" in body["message"], body
        body = refused(c, "POST", "/api/add", json={"name": "x", "spec": {**SPEC, "owner": "someone"}})
        assert body["field"] == "spec.owner", body  # a client never says whose a job is
        body = refused(c, "POST", "/api/add", json={"name": "x", "spec": {**SPEC, "metadata": [1]}})
        assert body["field"] == "spec.metadata", body
        refused(c, "GET", "/api/show", params={"fqid": job, "subjobs": "many"})
        refused(c, "POST", "/api/master", json={"fqid": job, "points": 0})
        refused(c, "POST", "/api/kill", json={})  # names no job
        assert snapshot(c) == before


def test_peek_names_and_deep_nesting_answer_400(services: list[Service], tmp_path: Path) -> None:
    service = start(services, tmp_path / "home")
    with service.client() as c:
        job = added(c)
        before = snapshot(c)
        for name in ("std\x00out", "x" * 10_000, "../../etc/passwd"):
            body = refused(c, "POST", "/api/peek", json={"fqid": job, "name": name})
            assert body["field"] == "name" and body["fqid"] == job, body
        refused(c, "GET", "/api/peek", params={"fqid": job, "name": "x" * 10_000})
        refused(c, "GET", f"/peek/{job}/{'x' * 10_000}")
        as_json = {"content-type": "application/json"}
        refused(c, "POST", "/api/jobs", content=b"[" * 100_000, headers=as_json)
        refused(c, "POST", "/api/jobs", content=b'{"name": ' + b"[" * 100_000, headers=as_json)
        deep: Any = "leaf"
        for _ in range(100):
            deep = {"a": [deep]}
        body = refused(c, "POST", "/api/annotate", json={"job": int(job), "metadata": deep})
        assert body["field"].startswith("metadata.a"), body
        assert snapshot(c) == before
    assert service.proc_().poll() is None


def test_a_broken_stored_definition_never_stops_the_service(services: list[Service], tmp_path: Path) -> None:
    service = start(services, tmp_path / "home")
    with service.client() as c:
        broken, good = added(c, "broken"), added(c, "good")
    assert service.terminate()[0] == 0
    with sqlite3.connect(service.home / "repository.sqlite") as db:  # as a bug of an older service could leave it
        db.execute("UPDATE jobs SET spec = '{}' WHERE id = ?", (int(broken),))
    again = start(services, service.home)
    listing = cli(again.home, "jobs")
    assert listing.returncode == 0 and "Traceback" not in listing.stdout + listing.stderr, listing
    assert "good" in listing.stdout and "broken" not in listing.stdout, listing.stdout
    assert "good" in cli_ok(again.home, "show", good)  # the others are served as before
    with again.client() as c:
        assert c.get("/api/jobs").status_code == 200 and c.get("/").status_code == 200
    said = [line for line in again.output().splitlines() if "stored job definition is unreadable" in line]
    assert len(said) == 1 and str(broken) in said[0] and "backend" in said[0], again.output()


def test_the_openapi_document_describes_every_method(services: list[Service], tmp_path: Path) -> None:
    service = start(services, tmp_path / "home")
    with service.client() as c:
        answer = c.get("/api/openapi.json")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("application/json")
    doc = answer.json()
    assert doc["openapi"].startswith("3.1")
    for method, cls in wire.REQUESTS.items():
        post = doc["paths"][f"/api/{method}"]["post"]
        assert set(post["responses"]) >= {"200", "400", "401", "403", "404", "409", "413"}, method
        ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        schema = doc["components"]["schemas"][ref.rsplit("/", 1)[1]]
        assert schema["additionalProperties"] is False and set(schema["properties"]) == set(cls.__struct_fields__)
    error = doc["components"]["schemas"]["ErrorAnswer"]
    assert {"error", "message", "field", "fqid"} <= set(error["properties"])
    assert doc["paths"]["/api/show"]["get"]["parameters"][0]["in"] == "query"


def test_the_python_api_through_the_service_sends_the_public_spec(services: list[Service], tmp_path: Path) -> None:
    service = start(services, tmp_path / "home")

    async def main() -> None:
        async with Orchestrator(home=service.home) as orch:
            assert orch.remote
            j = await orch.jobs.add(Job(name="late", application=Executable("/bin/echo", args=["a"]),
                                        backend="local", metadata={"run": 1}))
            j.application = Executable("/bin/echo", args=["changed"])  # a new job goes as it is defined now
            await j.submit()
            await j.wait(timeout=60)
            assert j.status == "completed" and (j.outputdir / "stdout").read_text() == "changed\n"
            with pytest.raises(JobError) as caught:  # a bad request comes back as the embedded error would
                await orch.jobs.add(Job(name="bad", application=Executable("/bin/echo"), backend="local",
                                        comment="x" * (2 << 20)))
            assert caught.value.field == "spec.comment" or caught.value.field == "comment", caught.value
        async with ServiceClient(socket=service.socket) as client:
            with pytest.raises(wire.BadRequest) as bad:
                await client.call("wait", fqid=j.fqid, timeout="x")
            assert bad.value.field == "timeout" and bad.value.fqid == j.fqid

    anyio.run(main)
