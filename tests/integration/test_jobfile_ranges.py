"""Job files that say "arguments 0 to 99" (Slurm's ``--array=0-99``) and products of parameters (Snakemake's
``expand``), with the same field errors as every other key."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from click.testing import CliRunner, Result

from orchestrator.cli import cli
from orchestrator.cli.jobfile import JobFileError, load_job


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def run(home: Path, *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, [*args, "--home", str(home)])
    assert result.exit_code == code, (args, result.exit_code, result.stdout, result.stderr, result.exception)
    return result


def write(tmp_path: Path, splitter: str, backend: str = "local") -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f'name = "scan"\n[application]\nexe = "/bin/echo"\nenv = {{ A = "1" }}\n'
                    f'[backend]\nname = "{backend}"\n[splitter]\n{splitter}\n')
    return path


def test_a_range_of_arguments_runs_one_subjob_each(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = write(tmp_path, 'type = "args"\nrange = "0-99"\ntemplate = ["point", "{}"]')
    job = run(home, "submit", str(path), "--wait").stdout.split()[0]
    shown = json.loads(run(home, "show", job, "--json").stdout)
    assert shown["subjobs"] == 100
    assert run(home, "peek", f"{job}.0").stdout == "point 0\n"
    assert run(home, "peek", f"{job}.99").stdout == "point 99\n"
    stepped = load_job(write(tmp_path, 'type = "args"\nrange = "0-9:5,20"'))
    assert stepped.splitter is not None and stepped.splitter.params() == {"args": [["0"], ["5"], ["20"]]}


def test_a_product_of_parameters_runs_every_combination(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = write(tmp_path, 'type = "product"\ntemplate = ["e={energy}", "seed={seed}"]\n'
                           'env = { SEED = "{seed}" }\n[splitter.params]\nenergy = [10, "20"]\nseed = "1-3"')
    job = run(home, "submit", str(path), "--wait").stdout.split()[0]
    outs = [run(home, "peek", f"{job}.{i}").stdout.strip() for i in range(6)]
    assert outs == [f"e={e} seed={s}" for e in (10, 20) for s in (1, 2, 3)]
    spec = load_job(path)
    assert spec.splitter is not None
    envs = spec.splitter.params()["multi_attrs"]["application.env"]
    assert envs[4] == {"A": "1", "SEED": "2"}  # the application's own env, and the parameter's


@pytest.mark.parametrize(("splitter", "field", "says"), [
    ('type = "args"\nrange = "9-0"', "splitter.range", "'9-0' is an empty range"),
    ('type = "args"\nrange = "a-b"', "splitter.range", "is not a range"),
    ('type = "args"\nrange = "0-3"\ntemplat = ["x"]', "splitter.templat", "did you mean 'template'?"),
    ('type = "product"\ntemplate = ["{sed}"]\n[splitter.params]\nseed = "1-2"', "splitter.template",
     "names {sed}, which is not a parameter"),
    ('type = "product"\ntemplate = ["{seed}"]\n[splitter.params]\nseed = true', "splitter.params.seed",
     "must be a string"),
    ('type = "product"\ntemplate = ["x"]', "splitter.params", "a product needs its parameters"),
])
def test_a_bad_range_or_product_names_the_field_and_leaves_nothing(tmp_path: Path, splitter: str, field: str,
                                                                   says: str) -> None:
    path = write(tmp_path, splitter)
    with pytest.raises(JobFileError) as caught:
        load_job(path)
    assert caught.value.field == field and says in str(caught.value)
    home = tmp_path / "home"
    refused = run(home, "submit", str(path), code=2)
    assert f"[field {field}]" in refused.stderr
    assert not home.exists()
