"""Building a :class:`~orchestrator.drivers.RunSpec`: what a driver needs to run a job once more."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from .drivers import RunSpec
from .job import Job
from .workspace import Workspace


def build_run_spec(job: Job, workspace: Workspace, home_key: str, extra_env: Mapping[str, str]) -> RunSpec:
    """The run of ``job`` at its current attempt; ``extra_env`` comes before the user's environment."""
    fq = job.fqid_tuple
    jobdir = workspace.jobdir(fq)
    shared = jobdir / "input" if len(fq) == 1 else jobdir.parent / "input"
    app = job.application
    assert app is not None
    counter = job.info.submit_counter
    return RunSpec(
        fqid=job.fqid, index=fq[-1] if len(fq) > 1 else 0, attempt=counter,
        key=f"orch-{home_key}-{job.fqid}-{counter}",
        executable=app.exe, args=tuple(app.args), env={**extra_env, **app.env},
        settings=dict(job.backend.settings),
        inputs=tuple(shared / Path(f).name for f in job.inputfiles), outputfiles=tuple(job.outputfiles),
        jobdir=jobdir, inputdir=jobdir / "input", outputdir=jobdir / "output", workdir=jobdir / "work",
        mode=job.mode, retry_count=max(counter - 1, 0), retry_args=tuple(job.info.retry_args),
    )
