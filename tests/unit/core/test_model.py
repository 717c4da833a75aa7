"""The plain-data parts of a job (orchestrator.core.model): copies, checks, round trips."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.core.errors import JobError
from orchestrator.core.model import (
    MAX_ARG_STRLEN,
    Backend,
    Executable,
    JobInfo,
    RetryPolicy,
    exec_size,
    plain_copy,
)


def refused(call: Any, message: str, field: str) -> None:
    with pytest.raises(JobError) as caught:
        call()
    assert str(caught.value) == f"job 4: {message} [field {field}]"
    assert caught.value.fqid == "4" and caught.value.field == field


class Odd:
    def __init__(self, items: list[int]) -> None:
        self.items = items


# ------------------------------------------------------------------ plain_copy, exec_size
def test_plain_copy_is_deep_and_keeps_types() -> None:
    inner = [1, {"a": [2]}]
    value = {"x": inner, "t": (3, [4]), "s": "s", "f": 1.5, "b": True, "n": None}
    copied = plain_copy(value)
    assert copied == value
    assert type(copied["t"]) is tuple and type(copied["x"]) is list
    inner.append(9)
    inner[1]["a"].append(5)  # type: ignore[index]
    value["t"][1].append(6)  # type: ignore[index]
    assert copied == {"x": [1, {"a": [2]}], "t": (3, [4]), "s": "s", "f": 1.5, "b": True, "n": None}
    odd = Odd([1])
    other = plain_copy({"o": odd})["o"]
    assert other is not odd and other.items == [1] and other.items is not odd.items
    assert plain_copy(7) == 7


def test_exec_size_counts_every_string_with_nul_and_pointer() -> None:
    assert exec_size("ab", [], {}) == 2 + 1 + 8
    assert exec_size("ab", ["c", "dé"], {"K": "v"}) == (2 + 9) + (1 + 9) + (3 + 9) + (3 + 9)


# ------------------------------------------------------------------ Executable
def test_executable_validate_cleans_args_and_env() -> None:
    e = Executable("/bin/x", [1, 2.5, "a"], {"A": 1, "B_2": "b"})  # type: ignore[list-item, dict-item]
    e.validate("4")
    assert e.args == ["1", "2.5", "a"] and e.env == {"A": "1", "B_2": "b"}
    Executable("x", ("a",), {}).validate("4")  # type: ignore[arg-type]


def test_executable_refusals() -> None:
    exes: list[Any] = ["", "  ", 3]
    for exe in exes:
        refused(lambda exe=exe: Executable(exe).validate("4"),
                "the executable must be a non-empty string", "application.exe")
    refused(lambda: Executable("x", "a b").validate("4"), "args must be a list, not str",  # type: ignore[arg-type]
            "application.args")
    refused(lambda: Executable("x", b"a").validate("4"), "args must be a list, not bytes",  # type: ignore[arg-type]
            "application.args")
    refused(lambda: Executable("x", {"a": 1}).validate("4"), "args must be a list, not dict",  # type: ignore[arg-type]
            "application.args")
    refused(lambda: Executable("x", ["a", True]).validate("4"),  # type: ignore[list-item]
            "argument 1 is a bool, not a string", "application.args")
    refused(lambda: Executable("x", [None]).validate("4"),  # type: ignore[list-item]
            "argument 0 is a NoneType, not a string", "application.args")
    refused(lambda: Executable("x", [], ["A"]).validate("4"),  # type: ignore[arg-type]
            "env must be a mapping of names to strings", "application.env")
    refused(lambda: Executable("x", [], {"1A": "v"}).validate("4"),
            "'1A' is not a valid environment variable name", "application.env")
    refused(lambda: Executable("x", [], {3: "v"}).validate("4"),  # type: ignore[dict-item]
            "3 is not a valid environment variable name", "application.env")
    refused(lambda: Executable("x", [], {"A": True}).validate("4"),  # type: ignore[dict-item]
            "the value of A must be a string", "application.env")
    refused(lambda: Executable("x", [], {"A": None}).validate("4"),  # type: ignore[dict-item]
            "the value of A must be a string", "application.env")


def test_executable_sizes() -> None:
    just = "a" * (MAX_ARG_STRLEN - 1)
    Executable("x", [just]).validate("4")
    refused(lambda: Executable("x", ["b", just + "a"]).validate("4"),
            f"argument 1 is {MAX_ARG_STRLEN} bytes long; the system allows at most {MAX_ARG_STRLEN - 1} bytes "
            "in one argument", "application.args")
    Executable("x", [], {"K": "v" * (MAX_ARG_STRLEN - 3)}).validate("4")
    refused(lambda: Executable("x", [], {"K": "v" * (MAX_ARG_STRLEN - 2)}).validate("4"),
            f"K is longer than the system allows for one variable ({MAX_ARG_STRLEN - 1} bytes)", "application.env")
    e = Executable("ab", ["c"], {"K": "v"})
    size = exec_size("ab", ["c"], {"K": "v"})
    e.validate("4", exec_limit=size)
    e.check_size("4", None)
    refused(lambda: e.validate("4", exec_limit=size - 1),
            f"the arguments and environment take {size} bytes; the system allows {size - 1} "
            "(ARG_MAX, less the wrapper's own environment)", "application.args")


def test_executable_round_trip_and_copy() -> None:
    e = Executable("/bin/x", ["a"], {"K": "v"})
    d = e.to_dict()
    assert d == {"type": "Executable", "exe": "/bin/x", "args": ["a"], "env": {"K": "v"}}
    d["args"].append("b")
    d["env"]["L"] = "w"
    assert e.args == ["a"] and e.env == {"K": "v"}
    assert Executable.from_dict(e.to_dict()) == e
    assert Executable.from_dict({"exe": "y"}) == Executable("y", [], {})
    c = e.copy()
    assert c == e
    c.args.append("z")
    c.env["Z"] = "z"
    assert e == Executable("/bin/x", ["a"], {"K": "v"})


# ------------------------------------------------------------------ Backend
def test_backend_settings_as_attributes() -> None:
    b = Backend("ssh", host="h", port=22)
    assert b.name == "ssh" and b.host == "h" and b.port == 22
    b.port = 23
    assert b.settings == {"host": "h", "port": 23}
    b.name = "other"
    assert b.name == "other" and "name" not in b.settings
    with pytest.raises(AttributeError, match=r"^backend 'other' has no setting 'mem'$"):
        _ = b.mem
    b.settings = {"x": 1}
    assert b.x == 1


def test_backend_equality_hash_repr() -> None:
    b = Backend("ssh", host="h")
    assert b == "ssh" and b != "local"
    assert b == Backend("ssh", host="h")
    assert b != Backend("ssh", host="g")
    assert b != Backend("slurm", host="h")
    assert b != 3
    assert hash(b) == hash("ssh")
    assert repr(b) == "Backend('ssh', host='h')"
    assert repr(Backend("local")) == "Backend('local')"
    assert repr(Backend("s", a=1, b="x")) == "Backend('s', a=1, b='x')"


def test_backend_copies_and_round_trip() -> None:
    b = Backend("ssh", hosts=["a"])
    c = b.copy()
    assert c == b and c is not b
    c.hosts.append("b")
    assert b.hosts == ["a"]
    d = b.to_dict()
    assert d == {"name": "ssh", "settings": {"hosts": ["a"]}}
    d["settings"]["hosts"].append("z")
    assert b.hosts == ["a"]
    assert Backend.from_dict(b.to_dict()) == b
    assert Backend.from_dict({"name": "x"}) == Backend("x")
    assert Backend.from_dict({"name": "x"}).settings == {}


def test_backend_coerce() -> None:
    assert Backend.coerce(None, "4") == Backend("local")
    assert Backend.coerce("ssh", "4") == Backend("ssh")
    assert Backend.coerce("ssh", "4").settings == {}
    b = Backend("x", a=1)
    assert Backend.coerce(b, "4") is b
    refused(lambda: Backend.coerce(3, "4"), "backend must be a name or Backend(...), not int",  # type: ignore[arg-type]
            "backend")


# ------------------------------------------------------------------ RetryPolicy, JobInfo
def test_retry_policy_round_trip_and_copy() -> None:
    p = RetryPolicy(1, 2, 3, 4.5, -1)
    assert p.to_dict() == {"max_early": 1, "max_late_handled": 2, "max_late_unhandled": 3, "early_seconds": 4.5,
                           "max_infrastructure": -1}
    assert RetryPolicy.from_dict(p.to_dict()) == p
    assert RetryPolicy.from_dict(None) == RetryPolicy()
    assert RetryPolicy.from_dict({"max_early": 2}) == RetryPolicy(max_early=2)
    c = p.copy()
    assert c == p and c is not p


def test_retry_policy_validate() -> None:
    RetryPolicy(0, 0, 0, 0.0, 0).validate("4")
    RetryPolicy().validate("4")
    RetryPolicy(max_infrastructure=-3).validate("4")
    for name in ("max_early", "max_late_handled", "max_late_unhandled", "early_seconds"):
        bads: list[Any] = [-1, True, "1"]
        for bad in bads:
            refused(lambda name=name, bad=bad: RetryPolicy(**{name: bad}).validate("4"),
                    f"must be a number >= 0, not {bad!r}", f"retry.{name}")
    others: list[Any] = [1.5, True, "1"]
    for bad in others:
        refused(lambda bad=bad: RetryPolicy(max_infrastructure=bad).validate("4"),
                f"must be a whole number (negative: as the three limits), not {bad!r}", "retry.max_infrastructure")


def test_job_info_round_trip() -> None:
    info = JobInfo(submit_counter=2, timestamps={"new": 1.0}, reason="r", history=[{"a": [1]}],
                   counters={"early": 1}, retry_args=["x"], outputs=["o"], refused=["f"], checkpoint={"seq": 3},
                   partition={"phase": "p"})
    d = info.to_dict()
    assert d == {"submit_counter": 2, "timestamps": {"new": 1.0}, "reason": "r", "history": [{"a": [1]}],
                 "counters": {"early": 1}, "retry_args": ["x"], "outputs": ["o"], "refused": ["f"],
                 "checkpoint": {"seq": 3}, "partition": {"phase": "p"}}
    d["history"][0]["a"].append(2)
    assert info.history == [{"a": [1]}]
    assert JobInfo.from_dict(info.to_dict()) == info
    assert JobInfo.from_dict({"reason": "x", "unknown": 1}) == JobInfo(reason="x")
    assert JobInfo.from_dict(None) == JobInfo()
