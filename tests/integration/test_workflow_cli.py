"""``orchestrator workflow ...`` on a TOML workflow file, through click's test runner (local backend)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

from orchestrator.features.workflows import parse_dagman
from orchestrator.features.workflows.cli import workflow_group

WORKFLOW = """
id = "reco001"
originator = "reco@fnal.gov"
retry = { max_early = 1 }

[[stage]]
[[stage.line]]
[[stage.line.binary]]
name = "reco"
executable = "./reco.sh"
inputs = [{ name = "raw_1.dat", locator = "tape/raw_1.dat", acquisition = "copy", disposition = "deletable" }]
outputs = ["reco_1.root", "filtered_1.root"]

[[stage]]
[[stage.line]]
[[stage.line.binary]]
name = "recoanalyze"
executable = "/bin/sh"
args = ["-c", "cat reco_1.root > ana_1.root"]
inputs = [{ name = "reco_1.root", disposition = "deletable" }]
outputs = ["ana_1.root"]
[[stage.line]]
[[stage.line.binary]]
name = "recoanalyze"
executable = "/bin/sh"
args = ["-c", "sleep 30"]
inputs = ["filtered_1.root"]
"""


def invoke(*args: str) -> Result:
    return CliRunner().invoke(workflow_group, list(args), catch_exceptions=False)


def test_submit_show_kill_line_and_export_a_workflow_file(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    (tmp_path / "tape").mkdir()
    (tmp_path / "tape" / "raw_1.dat").write_text("raw\n")
    (tmp_path / "reco.sh").write_text("#!/bin/sh\nsed s/raw/reco/ raw_1.dat > reco_1.root; echo f > filtered_1.root\n")
    (tmp_path / "reco.sh").chmod(0o755)
    path = tmp_path / "reco.toml"
    path.write_text(WORKFLOW)

    result = invoke("submit", str(path), "--home", home)
    assert result.exit_code == 0 and result.output == "reco001\n"
    result = invoke("show", "reco001", "--home", home)
    assert result.exit_code == 0
    assert "package 1.1.1" in result.output and "[reco]" in result.output and "line 2.2" in result.output

    result = invoke("wait", "reco001", "--home", home, "--timeout", "1.5")  # line 2.2 sleeps: still running
    assert result.exit_code == 1 and "timed out" in result.output
    result = invoke("kill-line", "reco001", "2.2", "--home", home)
    assert result.exit_code == 0 and "line 2.2 killed: 2.2.1" in result.output
    result = invoke("wait", "reco001", "--home", home, "--timeout", "20")
    assert result.exit_code == 0 and "workflow reco001 completed" in result.output
    data = tmp_path / "home" / "workflows" / "reco001" / "data"
    assert (data / "ana_1.root").read_text() == "reco\n" and not (data / "reco_1.root").exists()

    result = invoke("show", "reco001", "--home", home)
    assert "package 2.1.1  completed" in result.output and "package 2.2.1  killed" in result.output
    result = invoke("list", "--home", home)
    assert result.output.startswith("reco001  completed  3 packages")

    out = tmp_path / "export" / "reco001.dag"
    result = invoke("dagman", "reco001", "-o", str(out), "--home", home)
    assert result.exit_code == 0 and out.is_file() and (out.parent / "S2_L1_P1.sub").is_file()
    parsed = parse_dagman(out.read_text())
    assert parsed.edges == {("S1_L1_P1", "S2_L1_P1"), ("S1_L1_P1", "S2_L2_P1")}
    assert parsed.retries == {"S1_L1_P1": 1, "S2_L1_P1": 1, "S2_L2_P1": 1}
    assert invoke("dagman", "reco001", "--home", home).output == out.read_text()


def test_errors_are_one_line_with_exit_code_2(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    bad = tmp_path / "bad.toml"
    bad.write_text(WORKFLOW.replace('outputs = ["ana_1.root"]', 'outputs = ["ana_1.root", "filtered_1.root"]'))
    result = invoke("submit", str(bad), "--home", home)
    assert result.exit_code == 2 and "'filtered_1.root' is produced twice" in result.output
    cyclic = tmp_path / "cyclic.toml"
    cyclic.write_text(WORKFLOW.replace('locator = "tape/raw_1.dat", acquisition = "copy", ', "")
                      .replace('outputs = ["ana_1.root"]', 'outputs = ["ana_1.root", "raw_1.dat"]'))
    result = invoke("submit", str(cyclic), "--home", home)
    assert result.exit_code == 2 and "cycle through file" in result.output and "raw_1.dat" in result.output
    assert invoke("show", "nope", "--home", home).exit_code == 2
    result = invoke("kill-line", "nope", "2", "--home", home)
    assert result.exit_code == 2 and "STAGE.LINE" in result.output
