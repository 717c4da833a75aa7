"""Schemathesis against a real ``orchestrator serve`` (issue 22): thousands of requests generated from the
OpenAPI document the service serves, valid and invalid, over TCP with a token; none answers 5xx, and none
refused (4xx) changes what the service stores, as its public ``describe`` shows it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from served import Service

#: Generated requests per generation mode (valid, then invalid): 5,000 or more in all.
PER_MODE = int(os.environ.get("FUZZ_PER_MODE", "2600"))
SIM = {"application": {"exe": "/bin/true"}, "backend": {"name": "sim", "settings": {"run_seconds": 0.05}}}


@pytest.fixture
def fuzzed(tmp_path: Path) -> Iterator[Service]:
    service = Service(tmp_path / "home", "--tcp-port", "0").start()  # its token: <home>/service/token
    try:
        yield service
    finally:
        service.stop()


def stored(c: httpx.Client) -> dict[int, Any]:
    """What the service holds, as its public API describes it."""
    answer = c.post("/api/describe", json={})
    assert answer.status_code == 200, answer.text
    return {j["id"]: (j["name"], j["spec"], j["status"], j.get("codes"), j["owner"]) for j in answer.json()["jobs"]}


@pytest.mark.slow
def test_generated_requests_never_answer_5xx_nor_store_refused_ones(fuzzed: Service) -> None:
    auth = {"Authorization": f"Bearer {fuzzed.token}"}
    with fuzzed.client() as c:  # jobs for the requests to act on: one ended master, one new job
        for name, spec in (("ended", {**SIM, "splitter": {"plugin": "args", "params": {"args": [["a"], ["b"]]}}}),
                           ("fresh", SIM)):
            assert c.post("/api/add", json={"name": name, "spec": spec}).status_code == 200
        assert c.post("/api/submit", json={"fqid": "0"}).status_code == 200
        assert c.post("/api/wait", json={"fqid": "0", "timeout": 60}).json()["timed_out"] is False
        document = c.get("/api/openapi.json").json()
    schema = schemathesis.openapi.from_dict(document)
    session = requests.Session()
    session.headers.update(auth)
    seen: dict[int, int] = {}
    problems: list[str] = []
    t0 = time.monotonic()

    with fuzzed.client() as c:
        baseline = [stored(c)]

        def send(case: Any) -> None:  # a schemathesis Case
            try:
                response = case.call(base_url=fuzzed.url, session=session, timeout=30)
            except (requests.exceptions.InvalidHeader, requests.exceptions.InvalidURL, UnicodeError):
                return  # a request the client library refuses to send never reached the service
            code = response.status_code
            seen[code] = seen.get(code, 0) + 1
            if code >= 500:
                problems.append(f"{code} on {case.method} {case.path} {case.query} {case.body!r}: {response.text}")
            elif 400 <= code < 500:
                now = stored(c)
                if now != baseline[0]:
                    problems.append(f"{code} on {case.method} {case.path} {case.body!r} changed what is stored")
                baseline[0] = now
            else:  # accepted: it may have started runs; the next baseline is taken once they ended
                ids = [str(job) for job in stored(c)]
                if ids:
                    assert c.post("/api/wait", json={"targets": ids, "timeout": 60}).status_code == 200
                baseline[0] = stored(c)

        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            run = settings(max_examples=PER_MODE, deadline=None, database=None, phases=[Phase.generate],
                           suppress_health_check=list(HealthCheck))(given(case=schema.as_strategy(mode))(send))
            run()
    total = sum(seen.values())
    assert not problems, "\n".join(problems[:20])
    assert total >= 5000, seen
    assert seen.get(400, 0) > 1000 and seen.get(200, 0) > 100, seen  # both refused and accepted ones were tried
    assert fuzzed.proc_().poll() is None
    print(f"{total} generated requests in {time.monotonic() - t0:.0f} s: {dict(sorted(seen.items()))}")
