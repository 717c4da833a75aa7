"""No secret in a log line (issue 22, item 5): the JSON lines :func:`orchestrator.plugin.logs.configure` sets up,
written to a buffer, for a request's headers, a message, and an exception logged with its traceback."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from orchestrator.plugin.logs import configure, get_logger

SECRET = "s3cr3t-T0ken-of-the-admin-xyz"


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    out = io.StringIO()
    configure(json=True, level="INFO", stream=out)
    try:
        yield out
    finally:
        structlog.reset_defaults()


def logged(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_secrets_in_keys_and_in_text_are_blanked(lines: io.StringIO) -> None:
    log = get_logger(component="test")
    log.info("request", headers={"authorization": f"Bearer {SECRET}", "cookie": f"orch_session_8080={SECRET}",
                                 "host": "127.0.0.1:8080"},
             token=SECRET, password=SECRET, user="alice", url=f"http://127.0.0.1:8080/?token={SECRET}&x=1",
             header_pairs=[("Authorization", f"Bearer {SECRET}")])
    log.warning(f"refused Authorization: Bearer {SECRET} from a client")
    log.info("service ready", status_page="http://127.0.0.1:8080/?token=$(cat /home/a/service/token)")
    text = lines.getvalue()
    assert SECRET not in text, text
    first, second, third = logged(lines)
    assert first["headers"]["host"] == "127.0.0.1:8080" and first["user"] == "alice"
    assert first["headers"]["authorization"] == "[redacted]" and first["token"] == "[redacted]"
    assert first["url"] == "http://127.0.0.1:8080/?token=[redacted]&x=1"
    assert second["event"] == "refused Authorization: Bearer [redacted] from a client"
    # a command that reads the token file is not a secret: the status page's address stays as it is
    assert third["status_page"] == "http://127.0.0.1:8080/?token=$(cat /home/a/service/token)"


def test_a_traceback_shows_no_local_variables_and_no_secret(lines: io.StringIO) -> None:
    log = get_logger(component="test")

    def handle(headers: dict[str, str]) -> None:
        auth = headers["authorization"]
        raise ValueError(f"cannot use {auth}")

    try:
        handle({"authorization": f"Bearer {SECRET}"})
    except ValueError:
        log.exception("request failed")
    assert SECRET not in lines.getvalue()
    (line,) = logged(lines)
    (error,) = line["exception"]
    assert error["exc_type"] == "ValueError" and error["exc_value"] == "cannot use Bearer [redacted]"
    assert [frame["name"] for frame in error["frames"]][-1] == "handle"
    assert all("locals" not in frame for frame in error["frames"])


def test_a_logger_made_before_configure_follows_it() -> None:
    made_early = get_logger(component="early")  # as every module's logger is, at import
    out = io.StringIO()
    configure(json=True, level="INFO", stream=out)
    try:
        made_early.info("hello", token=SECRET)
    finally:
        structlog.reset_defaults()
    assert json.loads(out.getvalue()) | {"timestamp": None} == {
        "component": "early", "event": "hello", "token": "[redacted]", "level": "info", "timestamp": None}
