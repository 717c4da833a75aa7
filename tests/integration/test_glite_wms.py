"""The emulated WMS on its own: the protocol, idempotency, persistence across restarts, bad input, the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from orch_glite.cli import wms_group
from orch_glite.protocol import WMSError, call, http_call, node_spec, parse_endpoint, parse_listen
from orch_glite.testing import WMSProcess

from orchestrator.plugin import RunSpec

pytestmark = pytest.mark.anyio


@pytest.fixture
def wms(tmp_path: Path) -> Iterator[WMSProcess]:
    service = WMSProcess(tmp_path / "wms", faults={"reject": [7]}).start()
    try:
        yield service
    finally:
        service.stop()
        service.kill_nodes()


def node(tmp_path: Path, index: int, script: str = "echo hi", key: str | None = None) -> dict[str, Any]:
    jobdir = tmp_path / "jobs" / str(index)
    run = RunSpec(fqid=f"0.{index}", index=index, attempt=1, key=key or f"key-{index}", executable="/bin/sh",
                  args=("-c", script), env={}, settings={}, inputs=(), outputfiles=(), jobdir=jobdir,
                  inputdir=jobdir / "input", outputdir=jobdir / "output", workdir=jobdir / "work")
    return node_spec(run)


async def wait_state(endpoint: str, cid: str, states: set[str], timeout: float = 10) -> dict[str, Any]:
    with anyio.fail_after(timeout):
        while True:
            answer: dict[str, Any] = await call(endpoint, "GET", f"/v1/collections/{cid}")
            if {n["state"] for n in answer["nodes"].values()} <= states:
                return answer
            await anyio.sleep(0.05)


async def test_submission_is_idempotent_and_rejections_are_per_node(tmp_path: Path, wms: WMSProcess) -> None:
    doc = {"request": "r1", "nodes": [node(tmp_path, 0), node(tmp_path, 7), {"key": "k", "fqid": "0.9"}]}
    first = await call(wms.endpoint, "POST", "/v1/collections", doc)
    again = await call(wms.endpoint, "POST", "/v1/collections", doc)
    assert first == again  # a repeated request gets the first answer
    ok, rejected, malformed = first["nodes"]
    assert ok["node"] and ok["error"] is None
    assert rejected["node"] is None and "rejected by the WMS" in rejected["error"]  # --faults at start: reject 7
    assert malformed["node"] is None and "malformed node" in malformed["error"]
    # The same run in another request (a client that lost the answer and retried differently): the same node.
    other = await call(wms.endpoint, "POST", "/v1/nodes", {"request": "r2", "node": node(tmp_path, 0)})
    assert other["node"] == ok["node"] and other["collection"] == first["collection"]
    done = await wait_state(wms.endpoint, first["collection"], {"done"})
    assert list(done["nodes"]) == [ok["node"]] and done["nodes"][ok["node"]]["exit_code"] == 0
    assert (tmp_path / "jobs/0/output/stdout").read_text() == "hi\n"
    assert (await call(wms.endpoint, "GET", "/v1/ping"))["nodes"] == 1


async def test_output_cancel_and_unknown_ids(tmp_path: Path, wms: WMSProcess) -> None:
    doc = {"request": "r", "nodes": [node(tmp_path, 0), node(tmp_path, 1, "exec sleep 60")]}
    answer = await call(wms.endpoint, "POST", "/v1/collections", doc)
    cid, (n0, n1) = answer["collection"], [e["node"] for e in answer["nodes"]]
    with anyio.fail_after(10):
        while (await call(wms.endpoint, "GET", f"/v1/collections/{cid}"))["nodes"][n0]["state"] != "done":
            await anyio.sleep(0.05)
    listing = await call(wms.endpoint, "GET", f"/v1/nodes/{n0}/output")
    assert {"stdout", "stderr", "orch.1.log"} <= set(listing["files"])  # the wrapper's log of attempt 1
    assert await http_call(wms.endpoint, "GET", f"/v1/nodes/{n0}/output/stdout") == (200, b"hi\n")
    assert (await http_call(wms.endpoint, "GET", f"/v1/nodes/{n0}/output/..%2F..%2Fx"))[0] == 404
    cancel = await call(wms.endpoint, "POST", "/v1/cancel", {"nodes": [n0, n1, "n-nope"]})
    assert cancel["nodes"][n0] == {"state": "done", "error": None}  # already ended: a no-op
    assert cancel["nodes"][n1] == {"state": "cancelled", "error": None}
    assert "unknown node" in cancel["nodes"]["n-nope"]["error"]
    with pytest.raises(WMSError, match="unknown collection") as info:
        await call(wms.endpoint, "GET", "/v1/collections/c-nope")
    assert info.value.status == 404


async def test_bad_requests_are_answered_and_the_service_stays_up(tmp_path: Path, wms: WMSProcess) -> None:
    host, port = parse_endpoint(wms.endpoint)
    async with await anyio.connect_tcp(host, port) as stream:
        await stream.send(b"\x00\xffnot http at all\r\n\r\n")
        reply = b"".join([chunk async for chunk in stream])
    assert reply.startswith(b"HTTP/1.1 400")
    status, body = await http_call(wms.endpoint, "POST", "/v1/collections")
    assert status == 400 and b"request" in body
    for path, doc in [("/v1/collections", {"request": "x", "nodes": []}), ("/v1/faults", {"drop": {"all": 1}}),
                      ("/v1/cancel", {"nodes": "n-1"}), ("/v1/collections", {"request": "x", "nodes": [{}],
                                                                              "faults": [1]})]:
        with pytest.raises(WMSError) as info:
            await call(wms.endpoint, "PUT" if "faults" in path else "POST", path, doc)
        assert info.value.status == 400
    with pytest.raises(WMSError) as info:
        await call(wms.endpoint, "GET", "/v2/anything")
    assert info.value.status == 404
    assert (await call(wms.endpoint, "GET", "/v1/ping"))["service"] == "orch-glite-wms"


async def test_restart_keeps_collections_nodes_and_spent_faults(tmp_path: Path, wms: WMSProcess) -> None:
    doc = {"request": "r", "nodes": [node(tmp_path, 0), node(tmp_path, 1, "exec sleep 60")],
           "faults": {"garbage": {"status": 1}}}
    answer = await call(wms.endpoint, "POST", "/v1/collections", doc)
    cid = answer["collection"]
    status, body = await http_call(wms.endpoint, "GET", f"/v1/collections/{cid}")
    assert status == 200 and not body.startswith(b"{")  # the one garbage answer, now spent
    await wait_state(wms.endpoint, cid, {"done", "running"})
    first = wms.pid
    wms.stop()  # SIGTERM: the service goes, its nodes stay
    await wms.astart()
    assert wms.pid != first
    after = await call(wms.endpoint, "GET", f"/v1/collections/{cid}")  # garbage was spent before the restart
    states = {nid: n["state"] for nid, n in after["nodes"].items()}
    assert states == {answer["nodes"][0]["node"]: "done", answer["nodes"][1]["node"]: "running"}
    assert await call(wms.endpoint, "POST", "/v1/collections", doc) == answer


def test_one_state_directory_one_service(tmp_path: Path, wms: WMSProcess) -> None:
    proc = subprocess.run([sys.executable, "-m", "orch_glite", "serve", "--listen", "127.0.0.1:0", "--state",
                           str(wms.statedir)], capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and f"in use by another WMS (pid {wms.pid})" in proc.stderr


def test_cli_listens_on_loopback_only_and_checks_faults(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(wms_group, ["serve", "--listen", "0.0.0.0:8080", "--state", str(tmp_path)])
    assert result.exit_code == 2 and "loopback only" in result.output
    result = runner.invoke(wms_group, ["serve", "--state", str(tmp_path), "--faults", '{"abort": {"x": 1}}'])
    assert result.exit_code == 2 and "abort" in result.output
    assert set(wms_group.commands) == {"serve", "ping"}
    with pytest.raises(ValueError, match="loopback"):
        parse_listen("192.168.1.1:80")
    with pytest.raises(ValueError, match="loopback"):
        parse_endpoint("http://example.org:80")


def test_cli_ping(wms: WMSProcess) -> None:
    result = CliRunner().invoke(wms_group, ["ping", wms.endpoint])
    assert result.exit_code == 0 and json.loads(result.output)["pid"] == wms.pid
    wms.stop()
    result = CliRunner().invoke(wms_group, ["ping", wms.endpoint, "--timeout", "1"])
    assert result.exit_code == 1
