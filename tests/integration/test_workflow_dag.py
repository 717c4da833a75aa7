"""Workflows, pure parts: the model, the implied DAG, assessment, dispositions, DAGMan text, workflow files.

Also home of :func:`use_case_iv`, the seed's reconstruction use case, which
``test_workflow.py`` runs for real.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from orchestrator import RetryPolicy
from orchestrator.features.workflows import (
    Binary,
    Dag,
    FileSpec,
    Line,
    Package,
    Stage,
    Workflow,
    WorkflowError,
    build,
    parse_dagman,
)
from orchestrator.features.workflows.dag import Facts, assess, bottom_levels, due_files
from orchestrator.features.workflows.dagman import node_name, to_dagman
from orchestrator.features.workflows.script import package_script
from orchestrator.features.workflows.toml import WorkflowFileError, load_workflow

# A binary that really consumes its inputs and produces its outputs in the data dir.
PRODUCE = 'sleep "$PAUSE"; for o in $ORCH_OUTPUTS; do cat $ORCH_INPUTS > "$o"; echo "$o" >> "$o"; done'
STORE = 'sleep "$PAUSE"; mkdir -p "$STORE"; for f in $ORCH_INPUTS; do cp "$f" "$STORE/"; done'


def sh(script: str, inputs: Sequence[FileSpec | str] | None = None, outputs: Sequence[FileSpec | str] | None = None,
       name: str = "", **env: str) -> Binary:
    return Binary("/bin/sh", ["-c", script], inputs=files(inputs), outputs=files(outputs), name=name, env=env)


def files(names: Sequence[FileSpec | str] | None) -> list[FileSpec]:
    """A bare name is a file (as Binary reads it)."""
    return [FileSpec(f) if isinstance(f, str) else f for f in names or []]


def use_case_iv(n: int, tape: Path, store: Path, pause: float = 0.2, reco: str = PRODUCE,
                reco_retry: RetryPolicy | None = None) -> Workflow:
    """Seed use case IV: stage 1, one reco line per raw file; stage 2, m = 3n lines.

    Reco i reads raw_i.dat (copied from the "tape", deletable) and writes two
    all-reco files and one filtered-reco file. Per raw file, stage 2 runs
    recoanalyze on the all-reco files, stores them (both consumers: deletable),
    and runs recoanalyze on the filtered file (retained).
    """
    tape.mkdir(parents=True, exist_ok=True)
    stage1, stage2 = [], []
    for i in range(1, n + 1):
        raw = tape / f"raw_{i}.dat"
        raw.write_text(f"raw event data {i}\n")
        reco_out = [f"reco_{i}_a.root", f"reco_{i}_b.root"]
        binary = sh(reco, [FileSpec(raw.name, locator=str(raw), size=raw.stat().st_size, acquisition="copy",
                                    disposition="deletable")],
                    [*(FileSpec(f, estimated_size=100) for f in reco_out), FileSpec(f"filtered_{i}.root")],
                    name="reco", PAUSE=str(pause))
        stage1.append(Line([Package([binary], nodes=["localhost"], retry=reco_retry, estimated_run_time=pause)]))
        deletable = [FileSpec(f, disposition="deletable") for f in reco_out]
        stage2 += [
            Line([Package([sh(PRODUCE, deletable, [f"ana_{i}.root"], name="recoanalyze", PAUSE=str(pause))])]),
            Line([Package([sh(STORE, deletable, [], name="store", PAUSE=str(pause), STORE=str(store))])]),
            Line([Package([sh(PRODUCE, [FileSpec(f"filtered_{i}.root", disposition="retain")],
                              [f"ana_filtered_{i}.root"], name="recoanalyze", PAUSE=str(pause))])]),
        ]
    return Workflow(id="reco001", originator="reco@fnal.gov", priority=5, retry=RetryPolicy(max_early=1),
                    stages=[Stage(stage1), Stage(stage2)])


def expected_edges(n: int) -> set[tuple[str, str]]:
    """The seed's explicit DAG: each reco line is the parent of its three stage-2 lines."""
    return {(f"1.{i}.1", f"2.{3 * (i - 1) + j}.1") for i in range(1, n + 1) for j in (1, 2, 3)}


def chain(*links: tuple[Sequence[FileSpec | str], Sequence[FileSpec | str]], early: tuple[int, ...] = ()) -> Workflow:
    """One stage, one line per (inputs, outputs) pair."""
    lines = [Line([Package([sh("true", list(i), list(o))])], early_start=k in early) for k, (i, o) in enumerate(links)]
    return Workflow(id="w", stages=[Stage(lines)])


def built(wf: Workflow, exists: bool = True) -> Dag:
    return build(wf.normalized(), exists=lambda f: exists)


# ------------------------------------------------------------------ model
def test_ids_default_to_positions_and_keys_address_packages(tmp_path: Path) -> None:
    wf = use_case_iv(2, tmp_path / "tape", tmp_path / "store").normalized()
    keys = [k for k, *_ in wf.packages()]
    assert keys == ["1.1.1", "1.2.1", "2.1.1", "2.2.1", "2.3.1", "2.4.1", "2.5.1", "2.6.1"]
    assert Workflow.from_dict(wf.to_dict()).to_dict() == wf.to_dict()  # the stored form round-trips


@pytest.mark.parametrize(("change", "field"), [
    (lambda wf: setattr(wf.stages[0].lines[0].packages[0].binaries[0], "inputs", ["a/b"]),
     "stage[0].line[0].package[0].binary[0].inputs[0].name"),
    (lambda wf: setattr(wf.stages[0].lines[0], "id", "x.y"), "stage[0].line[0].id"),
    (lambda wf: setattr(wf.stages[0].lines[0].packages[0], "binaries", []), "stage[0].line[0].package[0].binary"),
    (lambda wf: setattr(wf.stages[0].lines[0].packages[0].binaries[0].inputs[0], "disposition", "keep"),
     "stage[0].line[0].package[0].binary[0].inputs[0].disposition"),
    (lambda wf: setattr(wf, "slots", -1), "slots"),
])
def test_bad_values_name_the_field(change: object, field: str) -> None:
    wf = chain((["x"], ["a"]))
    change(wf)  # type: ignore[operator]
    with pytest.raises(WorkflowError) as info:
        wf.normalized()
    assert info.value.field == field


# -------------------------------------------------------------------- DAG
def test_implied_edges_of_use_case_iv(tmp_path: Path) -> None:
    dag = built(use_case_iv(5, tmp_path / "tape", tmp_path / "store"))
    assert dag.edges() == expected_edges(5)
    assert dag.disposition["reco_3_a.root"] == "deletable"
    assert dag.disposition["filtered_3.root"] == "retain"
    assert dag.disposition["ana_3.root"] == "retain"  # nobody consumes it
    assert set(dag.external) == {f"raw_{i}.dat" for i in range(1, 6)}


def test_files_made_inside_a_package_are_no_dependency() -> None:
    wf = Workflow(id="w", stages=[Stage([Line([Package([sh("true", ["x"], ["mid"]), sh("true", ["mid"], ["out"])])]),
                                         Line([Package([sh("true", ["out"], [])])])])])
    dag = built(wf)
    assert dag.nodes["1.1.1"].inputs == ("x",) and dag.edges() == {("1.1.1", "1.2.1")}


def test_cycle_is_refused_naming_a_file() -> None:
    wf = chain((["c.dat"], ["a.dat"]), (["a.dat"], ["b.dat"]), (["b.dat"], ["c.dat"]))
    with pytest.raises(WorkflowError, match=r"cycle through file '(a|b|c)\.dat'") as info:
        built(wf)
    assert info.value.file in ("a.dat", "b.dat", "c.dat") and info.value.file in str(info.value)
    assert "package 1.1.1" in str(info.value) and "package 1.3.1" in str(info.value)


def test_cycle_inside_a_package_is_refused() -> None:
    wf = Workflow(id="w", stages=[Stage([Line([Package([sh("true", ["late"], []), sh("true", [], ["late"])])])])])
    with pytest.raises(WorkflowError, match="cycle inside package 1.1.1.*'late'") as info:
        built(wf)
    assert info.value.file == "late"


def test_missing_producer_is_refused_naming_the_file() -> None:
    wf = chain((["nowhere.dat"], ["a"]))
    with pytest.raises(WorkflowError, match="'nowhere.dat'.*produced by no package and does not exist") as info:
        built(wf, exists=False)
    assert info.value.file == "nowhere.dat"
    built(wf, exists=True)  # an existing input is fine


def test_a_file_produced_twice_is_refused() -> None:
    with pytest.raises(WorkflowError, match="'a' is produced twice") as info:
        built(chain(([], ["a"]), ([], ["a"])))
    assert info.value.file == "a"


def test_disagreeing_dispositions_keep_the_most_careful() -> None:
    wf = chain(([], ["f"]), ([FileSpec("f", disposition="deletable")], []), ([FileSpec("f", disposition="temporary")],
                                                                          []))
    assert built(wf).disposition["f"] == "temporary"


# ------------------------------------------------------------- assessment
def test_ready_set_follows_completed_producers(tmp_path: Path) -> None:
    dag = built(use_case_iv(2, tmp_path / "tape", tmp_path / "store"))
    a = assess(dag, {})
    assert a.ready == ["1.1.1", "1.2.1"] and a.status == "running"
    assert a.waiting_for["2.1.1"] == ["reco_1_a.root", "reco_1_b.root"]
    a = assess(dag, {"1.1.1": Facts("completed"), "1.2.1": Facts("running")})
    assert a.ready == ["2.1.1", "2.2.1", "2.3.1"] and a.active == 1 and a.states["2.4.1"] == "waiting"


def test_early_start_line_starts_once_producers_run() -> None:
    dag = built(chain(([], ["f"]), (["f"], []), early=(1,)))
    assert assess(dag, {"1.1.1": Facts("submitted")}).ready == []
    assert assess(dag, {"1.1.1": Facts("running")}).ready == ["1.2.1"]


def test_statuses_held_failed_blocked_completed() -> None:
    dag = built(chain(([], ["f"]), (["f"], [])))
    assert assess(dag, {}, hold=True).status == "held"
    assert assess(dag, {"1.1.1": Facts(hold=True)}).states == {"1.1.1": "held", "1.2.1": "waiting"}
    assert assess(dag, {"1.1.1": Facts("failed")}).status == "failed"
    assert assess(dag, {"1.1.1": Facts(error="no disk")}).states["1.1.1"] == "failed"
    killed = assess(dag, {"1.1.1": Facts(killed=True)})
    assert killed.status == "blocked" and killed.states["1.2.1"] == "waiting"
    dropped = assess(dag, {"1.1.1": Facts(killed=True)}, dropped=["f"])
    assert dropped.ready == ["1.2.1"]
    done = {"1.1.1": Facts(killed=True), "1.2.1": Facts("completed")}
    assert assess(dag, done, dropped=["f"]).status == "completed"


def test_due_files_wait_for_every_consumer() -> None:
    wf = chain(([], ["f"]), ([FileSpec("f", disposition="deletable")], []), ([FileSpec("f", disposition="deletable")],
                                                                          []))
    dag = built(wf)
    states = {"1.1.1": "completed", "1.2.1": "completed", "1.3.1": "running"}
    assert due_files(dag, states) == []
    assert due_files(dag, {**states, "1.3.1": "killed"}) == [("f", "deletable")]


def test_bottom_levels_measure_the_critical_path() -> None:
    wf = chain(([], ["a"]), (["a"], ["b"]), (["b"], []), ([], []), ([], []))
    wf.stages[0].lines[4].packages[0].priority = 3
    dag = built(wf)
    levels = bottom_levels(dag)
    assert levels["1.1.1"] == 3.0 and levels["1.2.1"] == 2.0 and levels["1.4.1"] == 1.0


# ----------------------------------------------------------------- DAGMan
def test_dagman_parsed_back_has_exactly_the_implied_edges(tmp_path: Path) -> None:
    dag = built(use_case_iv(5, tmp_path / "tape", tmp_path / "store"))
    text = to_dagman(dag, workflow="reco001", retries={k: 2 for k in dag.nodes}, slots=3)
    parsed = parse_dagman(text)
    assert set(parsed.jobs) == {node_name(k) for k in dag.nodes}
    assert parsed.edges == {(node_name(p), node_name(c)) for p, c in expected_edges(5)}
    assert parsed.retries == {node_name(k): 2 for k in dag.nodes} and parsed.maxjobs == {"reco001": 3}
    assert "PARENT S1_L1_P1 CHILD S2_L1_P1 S2_L2_P1 S2_L3_P1" in text
    with pytest.raises(ValueError, match="no JOB line"):
        parse_dagman("JOB a a.sub\nPARENT a CHILD b\n")


# ----------------------------------------------------------------- script
def test_package_script_leaves_out_dropped_inputs(tmp_path: Path) -> None:
    pkg = Package([sh("true", ["x", "gone"], ["y"], name="b1"), sh("true", ["y"], ["z"])])
    text = package_script(pkg, "1.1.1", workflow="w", datadir=tmp_path / "data", markdir=tmp_path / "m",
                          dropped={"gone"})
    assert "ORCH_INPUTS=x " in text and "gone" not in text
    assert '[ -f "$MARKS/2.done" ] && [ -e z ]' in text


# ------------------------------------------------------------ TOML files
WORKFLOW_TOML = """
id = "t1"
originator = "me@example.org"
slots = 2
retry = { max_early = 1 }
[[stage]]
[[stage.line]]
[[stage.line.binary]]
name = "make"
executable = "./make.sh"
inputs = [{ name = "raw.dat", locator = "raw.dat", acquisition = "copy", disposition = "deletable" }]
outputs = ["mid.dat"]
[[stage]]
[[stage.line]]
early_start = true
[[stage.line.package]]
priority = 2
[[stage.line.package.binary]]
executable = "/bin/cat"
args = ["mid.dat"]
inputs = ["mid.dat"]
"""


def test_workflow_file_resolves_paths_against_its_directory(tmp_path: Path) -> None:
    (tmp_path / "make.sh").write_text("cp raw.dat mid.dat\n")
    path = tmp_path / "wf.toml"
    path.write_text(WORKFLOW_TOML)
    wf = load_workflow(path)
    b = wf.stages[0].lines[0].packages[0].binaries[0]
    assert b.executable == str(tmp_path / "make.sh") and b.inputs[0].locator == str(tmp_path / "raw.dat")
    assert wf.stages[1].lines[0].early_start and wf.stages[1].lines[0].packages[0].priority == 2
    assert wf.retry == RetryPolicy(max_early=1) and wf.slots == 2


@pytest.mark.parametrize(("text", "field", "message"), [
    ("[[stage]]\n[[stage.line]]\n[[stage.line.binary]]\nexecutable = 'x'\nouputs = []\n",
     "stage[0].line[0].package[0].binary[0].ouputs", "unknown key 'ouputs'"),
    ("priority = 'high'\n[[stage]]\n[[stage.line]]\n[[stage.line.binary]]\nexecutable = 'x'\n", "priority",
     "must be an integer"),
    ("[[stage]]\n", "stage[0].line", "at least one line"),
    ("id = 3\n[[stage", None, "TOML syntax error"),
])
def test_bad_workflow_files_name_the_file_and_field(tmp_path: Path, text: str, field: str | None,
                                                    message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(WorkflowFileError, match=message) as info:
        load_workflow(path)
    assert str(path) in str(info.value) and info.value.field == field
