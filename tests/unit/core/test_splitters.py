"""The built-in splitters, deltas and the exact step partition (orchestrator.core.splitters), pure functions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from orchestrator.core.errors import JobError
from orchestrator.core.splitters import (
    ArgSplitter,
    FileSplitter,
    GenericSplitter,
    Master,
    apply_delta,
    as_master,
    check_path,
    deferred,
    integer_weights,
    is_deferred,
    partition_contiguous,
)

SPEC: dict[str, Any] = {"name": "m", "application": {"exe": "/bin/x", "args": ["0"]},
                        "backend": {"name": "sim", "settings": {"mem": 1}}, "inputfiles": ["a", "b", "c", "d", "e"]}


def master(**spec: Any) -> Master:
    return Master("7", {**SPEC, **spec})


def refused(call: Any, message: str, field: str, fqid: str = "7") -> None:
    with pytest.raises(JobError) as caught:
        call()
    assert str(caught.value) == f"job {fqid}: {message} [field {field}]"
    assert caught.value.field == field
    assert caught.value.fqid == fqid


class Job:
    """An unsubmitted job as a splitter also takes it."""

    fqid_or_new = "(new job 3)"
    name = "j"

    def spec(self) -> Mapping[str, Any]:
        return SPEC


# ------------------------------------------------------------------ deferred definitions, as_master
def test_a_deferred_splitter_keeps_its_name_only() -> None:
    d = deferred({"plugin": "args", "args": [["a"]] * 3})
    assert d == {"plugin": "args", "deferred": True}
    assert is_deferred(d)
    assert not is_deferred({"plugin": "args", "deferred": False})
    assert not is_deferred({"plugin": "args"})
    assert not is_deferred(["deferred"])


def test_as_master_takes_a_master_or_an_unsubmitted_job() -> None:
    m = master()
    assert as_master(m) is m
    seen = as_master(Job())
    assert seen == Master("(new job 3)", SPEC, 1, "j")
    assert seen.free_slots == 1 and seen.name == "j"

    class Bare:
        def spec(self) -> Mapping[str, Any]:
            return {"x": 1}

    assert as_master(Bare()) == Master("(new job)", {"x": 1}, 1, "")
    with pytest.raises(TypeError, match=r"^a splitter splits a job, not 3$"):
        as_master(3)  # type: ignore[arg-type]

    class NoSpec:
        spec = {"x": 1}

    with pytest.raises(TypeError, match="a splitter splits a job"):
        as_master(NoSpec())  # type: ignore[arg-type]

    class NotAMapping:
        def spec(self) -> list[int]:
            return [1]

    with pytest.raises(TypeError, match="a splitter splits a job"):
        as_master(NotAMapping())  # type: ignore[arg-type]


# ------------------------------------------------------------------ paths and deltas
@pytest.mark.parametrize("path", ["application.exe", "application.args", "application.env", "backend.mem",
                                  "name", "inputfiles", "outputfiles", "steps", "step_weights", "mode"])
def test_settable_paths(path: str) -> None:
    check_path(path, "7")


@pytest.mark.parametrize("path", ["application.other", "application", "backend", "backend.", "backend.a.b",
                                  "info", "application.args.x", "nameX", "other.mem"])
def test_paths_a_subjob_cannot_set(path: str) -> None:
    refused(lambda: check_path(path, "7"), f"has no settable attribute {path!r}", path)


def test_apply_delta_sets_application_backend_and_top_fields_leaving_the_master() -> None:
    nested: list[str] = ["nested"]
    args: list[object] = ["a", nested]
    out = apply_delta(SPEC, {"application.args": args, "backend.mem": 4, "inputfiles": ["z"], "name": "s"})
    assert out["application"] == {"exe": "/bin/x", "args": ["a", ["nested"]]}
    assert out["backend"] == {"name": "sim", "settings": {"mem": 4}}
    assert out["inputfiles"] == ["z"] and out["name"] == "s"
    assert SPEC["application"]["args"] == ["0"] and SPEC["backend"]["settings"] == {"mem": 1}
    assert SPEC["inputfiles"] == ["a", "b", "c", "d", "e"] and SPEC["name"] == "m"
    nested.append("changed")
    assert out["application"]["args"] == ["a", ["nested"]]  # copied, not shared


def test_apply_delta_copies_top_fields_and_backend_values() -> None:
    files = [["f"]]
    mem: dict[str, list[int]] = {"gb": [1]}
    out = apply_delta(SPEC, {"inputfiles": files, "backend.mem": mem})
    files[0].append("g")
    mem["gb"].append(2)
    assert out["inputfiles"] == [["f"]]
    assert out["backend"]["settings"]["mem"] == {"gb": [1]}


def test_apply_delta_keeps_the_other_backend_settings() -> None:
    spec = {"backend": {"name": "slurm", "settings": {"mem": "1G", "partition": "a"}}}
    out = apply_delta(spec, {"backend.mem": "2G"})
    assert out["backend"] == {"name": "slurm", "settings": {"mem": "2G", "partition": "a"}}
    assert spec["backend"]["settings"] == {"mem": "1G", "partition": "a"}


def test_apply_delta_on_a_master_without_application_or_settings() -> None:
    out = apply_delta({"backend": {"name": "sim"}}, {"application.exe": "/bin/y", "backend.cores": 2})
    assert out == {"application": {"exe": "/bin/y"}, "backend": {"name": "sim", "settings": {"cores": 2}}}
    out = apply_delta({"application": None, "backend": {"name": "s"}}, {"application.args": ["1"]})
    assert out["application"] == {"args": ["1"]}


# ------------------------------------------------------------------ GenericSplitter
def test_generic_one_attribute() -> None:
    s = GenericSplitter(attribute="application.args", values=(["a"], ["b"]))
    assert s.split(master()) == [{"application.args": ["a"]}, {"application.args": ["b"]}]
    assert s.params() == {"attribute": "application.args", "values": [["a"], ["b"]], "multi_attrs": {}}
    assert s.split(Job()) == [{"application.args": ["a"]}, {"application.args": ["b"]}]


def test_generic_multi_attrs_zip_with_the_attribute() -> None:
    s = GenericSplitter(attribute="name", values=["x", "y"], multi_attrs={"backend.mem": (1, 2)})
    assert s.split(master()) == [{"backend.mem": 1, "name": "x"}, {"backend.mem": 2, "name": "y"}]
    assert s.params()["multi_attrs"] == {"backend.mem": [1, 2]}
    assert GenericSplitter(multi_attrs={"name": ["p"]}).split(master()) == [{"name": "p"}]


def test_generic_refusals() -> None:
    m = master()
    refused(lambda: GenericSplitter(attribute="name").split(m),
            "GenericSplitter has an attribute but no values", "splitter.values")
    refused(lambda: GenericSplitter(values=[1]).split(m),
            "GenericSplitter has values but no attribute", "splitter.attribute")
    refused(lambda: GenericSplitter().split(m),
            "GenericSplitter needs attribute and values, or multi_attrs", "splitter")
    refused(lambda: GenericSplitter(attribute="name", values=["a"], multi_attrs={"backend.mem": [1, 2]}).split(m),
            "GenericSplitter's value lists differ in length: {'backend.mem': 2, 'name': 1}", "splitter.multi_attrs")
    refused(lambda: GenericSplitter(attribute="name", values=[]).split(m),
            "GenericSplitter has no values: it would make no subjob", "splitter.values")
    refused(lambda: GenericSplitter(attribute="info", values=[1]).split(m),
            "has no settable attribute 'info'", "info")
    refused(lambda: GenericSplitter(multi_attrs={"name": ["a"], "bogus": [1]}).split(m),
            "has no settable attribute 'bogus'", "bogus")


def test_splitters_compare_by_type_and_parameters() -> None:
    a = GenericSplitter(attribute="name", values=["x"])
    assert a == GenericSplitter(attribute="name", values=["x"])
    assert a != GenericSplitter(attribute="name", values=["y"])
    assert ArgSplitter([["x"]]) != GenericSplitter(attribute="application.args", values=[["x"]])
    assert FileSplitter(2) != "files"
    assert hash(a) == hash(GenericSplitter()) == hash(GenericSplitter)
    assert repr(FileSplitter(3)) == "FileSplitter(files_per_job=3)"
    assert repr(ArgSplitter([("a", 1)])) == "ArgSplitter(args=[['a', 1]])"
    assert repr(GenericSplitter(attribute="name", values=["x"])) == \
        "GenericSplitter(attribute='name', values=['x'], multi_attrs={})"


# ------------------------------------------------------------------ ArgSplitter, FileSplitter
def test_arg_splitter() -> None:
    s = ArgSplitter([("a", 1), ["b"]])
    assert s.params() == {"args": [["a", 1], ["b"]]}
    assert s.split(master()) == [{"application.args": ["a", 1]}, {"application.args": ["b"]}]
    assert s.split(Job())[1] == {"application.args": ["b"]}
    refused(lambda: ArgSplitter([]).split(master()),
            "ArgSplitter has no argument lists: it would make no subjob", "splitter.args")
    refused(lambda: ArgSplitter([["a"], "b"]).split(master()), "argument set 1 is 'b', not a list", "splitter.args")
    refused(lambda: ArgSplitter(["b"]).split(Job()), "argument set 0 is 'b', not a list", "splitter.args",
            fqid="(new job 3)")


def test_file_splitter() -> None:
    assert FileSplitter().params() == {"files_per_job": 1}
    assert FileSplitter().split(master(inputfiles=["a", "b"])) == [{"inputfiles": ["a"]}, {"inputfiles": ["b"]}]
    assert FileSplitter(2).split(master()) == [{"inputfiles": ["a", "b"]}, {"inputfiles": ["c", "d"]},
                                               {"inputfiles": ["e"]}]
    assert FileSplitter(5).split(Job()) == [{"inputfiles": ["a", "b", "c", "d", "e"]}]
    assert FileSplitter(9).split(master()) == [{"inputfiles": ["a", "b", "c", "d", "e"]}]
    bads: list[Any] = [0, -1, True, 1.5, "2"]
    for bad in bads:
        refused(lambda bad=bad: FileSplitter(bad).split(master()),
                f"files_per_job must be an integer >= 1, not {bad!r}", "splitter.files_per_job")
    nothing: list[Any] = [[], None]
    for files in nothing:
        refused(lambda files=files: FileSplitter(1).split(master(inputfiles=files)),
                "FileSplitter needs input files, and the job has none", "inputfiles")
    refused(lambda: FileSplitter(1).split(Master("7", {"name": "m"})),
            "FileSplitter needs input files, and the job has none", "inputfiles")


# ------------------------------------------------------------------ the exact partition
def test_integer_weights_are_exactly_proportional() -> None:
    assert integer_weights([3, 1, 2]) == [3, 1, 2]
    assert integer_weights([0.5, 0.25, 1]) == [2, 1, 4]
    assert integer_weights([1.5, 3.0]) == [3, 6]
    assert integer_weights([]) == []


def sums(weights: list[float], starts: list[int]) -> list[float]:
    bounds = [*starts, len(weights)]
    return [sum(weights[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]


@pytest.mark.parametrize(("weights", "m", "starts"), [
    ([1, 1, 1, 1], 2, [0, 2]),
    ([1, 1, 1, 1], 4, [0, 1, 2, 3]),
    ([1, 1, 1, 1], 9, [0, 1, 2, 3]),
    ([1, 1, 1, 1], 1, [0]),
    ([5, 1, 1, 1, 1, 1], 2, [0, 1]),
    ([1, 1, 1, 1, 1, 5], 2, [0, 5]),
    ([2, 2, 2, 3, 3], 2, [0, 3]),
    ([7, 2, 5, 10, 8], 2, [0, 3]),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9], 3, [0, 5, 7]),
    ([0, 0, 0, 0], 2, [0, 3]),
    ([0.5, 0.5, 1.0], 2, [0, 2]),
    ([3], 1, [0]),
    ([10, 1, 1], 3, [0, 1, 2]),
])
def test_partition_contiguous(weights: list[float], m: int, starts: list[int]) -> None:
    assert partition_contiguous(weights, m) == starts


def test_partition_is_optimal_against_brute_force() -> None:
    from itertools import combinations

    cases: list[list[float]] = [[4, 1, 3, 2, 5, 1], [1, 9, 1, 1, 9, 1, 1], [2.5, 0.5, 1.0, 3.0], [6, 6, 1, 1, 1, 1, 6]]
    for weights in cases:
        n = len(weights)
        for m in range(1, n + 1):
            starts = partition_contiguous(weights, m)
            assert len(starts) == m and starts[0] == 0 and starts == sorted(set(starts))
            best = min(max(sums(weights, [0, *cut])) for cut in combinations(range(1, n), m - 1))
            assert max(sums(weights, starts)) == best


def test_partition_of_nothing_and_bad_weights() -> None:
    assert partition_contiguous([], 3) == []
    assert partition_contiguous([1, 2], 0) == []
    assert partition_contiguous([1, 2], -1) == []
    with pytest.raises(ValueError, match="^step weights must not be negative$"):
        partition_contiguous([1, -1, 2], 2)


def test_a_large_partition() -> None:
    weights = [1] * 100_000
    starts = partition_contiguous(weights, 4)
    assert starts == [0, 25_000, 50_000, 75_000]
