"""The commands that act on jobs: kill, resubmit, release, remove, force-status, merge.

Each takes several ids and ranges (:mod:`.targets`): ``kill 3.1 3.4``, ``resubmit 3.[0-9]``, ``release 3-5``.
Every id is looked up first, then each is acted on in the order given, one line each; exit 3 when nothing
was done for any of them (the lines say why).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from ..api import views
from ..api.orchestrator import Orchestrator
from ..api.transport import Done
from ..core.statuses import JobStatus
from . import render
from .app import NOTHING_TO_DO, CliError, home_option, run
from .commands import cli
from .targets import Named, Target, job_ids_argument, resolve


def _said(target: Target, done: Done, verb: str) -> str:
    """``job 3: killed``; for a range of subjobs, how many and the master's status."""
    if target.indexes is None:
        return f"job {target.label}: {target.job.status.value}"
    return f"job {target.label}: {verb} {done.acted} subjob(s); job {target.job.fqid} {target.job.status.value}"


def _end(acted: int) -> None:
    if not acted:
        click.get_current_context().exit(NOTHING_TO_DO)


@cli.command()
@job_ids_argument
@click.option("--keep-going", is_flag=True, help="Go on past a subjob that cannot be killed.")
@home_option
def kill(job_ids: Sequence[Named], keep_going: bool, home: Path | None) -> None:
    """Kill jobs (a master: every active subjob), subjobs or ranges of them (ID...: 3 3.1 3.[0-9] 3.0-99);
    exit 3 when nothing was left to kill."""

    async def body(orch: Orchestrator) -> int:
        acted = 0
        for target in resolve(orch, job_ids):
            done = await target.slice.kill(keep_going=keep_going)
            acted += done.acted
            if done.acted:
                click.echo(_said(target, done, "killed"))
            else:
                click.echo(f"job {target.label}: nothing to kill ({target.job.status.value})")
        return acted

    _end(run(home, body))


@cli.command()
@job_ids_argument
@click.option("--all", "all_", is_flag=True, help="On a master: killed subjobs too, not only the failed ones.")
@click.option("--keep-going", is_flag=True, help="Go on past a subjob that cannot be resubmitted.")
@click.option("--from-state", "from_state", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Start from this saved state (written by 'orchestrator checkpoint get -o').")
@home_option
def resubmit(job_ids: Sequence[Named], all_: bool, keep_going: bool, from_state: Path | None,
             home: Path | None) -> None:
    """Resubmit a master's failed subjobs (--all: and killed ones), or jobs, subjobs and ranges of them
    (ID...: 3 3.1 3.[0-9] 3.0-99); exit 3 when there was nothing to resubmit."""
    state = from_state.read_text(encoding="utf-8") if from_state is not None else None
    if state is not None and (len(job_ids) != 1 or job_ids[0][1] is not None):
        raise CliError("--from-state starts one job or subjob from a state: name exactly one")

    async def body(orch: Orchestrator) -> int:
        acted = 0
        for target in resolve(orch, job_ids):
            job = target.job
            if state is not None:
                await job.resubmit(keep_going=keep_going, from_state=state)
                click.echo(f"job {job.fqid}: resubmitted from state {from_state}; {job.status.value}")
                return 1
            done = await target.slice.resubmit(only_failed=not all_, keep_going=keep_going)
            acted += done.acted
            if not done.acted:
                click.echo(_nothing_to_resubmit(target, all_))
            elif target.indexes is not None:
                click.echo(_said(target, done, "resubmitted"))
            else:
                what = f" {done.acted} subjob(s)" if views.counts(job) else ""
                click.echo(f"job {job.fqid}: resubmitted{what}; {job.status.value}")
        return acted

    _end(run(home, body))


def _nothing_to_resubmit(target: Target, all_: bool) -> str:
    """Why nothing was resubmitted, and what to do instead."""
    job = target.job
    killed = target.indexes is None and job.parent is None and views.counts(job).get("killed")
    hint = " (--all takes the killed ones too)" if killed and not all_ else ""
    return f"job {target.label}: no subjob to resubmit{hint}"


@cli.command()
@job_ids_argument
@click.option("--arg", "args", multiple=True, help="A retry argument (ORCH_RETRY_ARG_n), in order; repeatable.")
@home_option
def release(job_ids: Sequence[Named], args: tuple[str, ...], home: Path | None) -> None:
    """Resume held jobs, a master's held subjobs, or ranges of subjobs, optionally with new retry arguments."""

    async def body(orch: Orchestrator) -> None:
        for target in resolve(orch, job_ids):
            done = await target.slice.release(retry_args=list(args) if args else None)
            if target.indexes is None:
                click.echo(f"job {target.job.fqid}: released; {target.job.status.value}")
            else:
                click.echo(_said(target, done, "released"))

    run(home, body)


@cli.command()
@job_ids_argument
@home_option
def remove(job_ids: Sequence[Named], home: Path | None) -> None:
    """Forget final or new top-level jobs (ID...: 3 4 5, 3-5) and delete their workspaces."""

    async def body(orch: Orchestrator) -> None:
        for target in resolve(orch, job_ids):
            if target.indexes is not None:
                raise CliError(f"job {target.label}: subjobs are removed with their master "
                               f"('orchestrator remove {target.job.fqid}')")
        for target in resolve(orch, job_ids):
            await target.job.remove()
            click.echo(f"job {target.label}: removed")

    run(home, body)


@cli.command("force-status")
@job_ids_argument
@click.argument("status", type=click.Choice([JobStatus.FAILED.value, JobStatus.COMPLETED.value]))
@click.option("--force", is_flag=True, help="Leave the backend alone: do not kill an active run first.")
@click.option("--keep-going", is_flag=True, help="Go on past a job that cannot be marked.")
@home_option
def force_status(job_ids: Sequence[Named], status: str, force: bool, keep_going: bool, home: Path | None) -> None:
    """Mark stuck jobs, subjobs or ranges of them (ID...) failed or completed; an active one is killed first
    unless --force. Recorded as forced in the history."""

    async def body(orch: Orchestrator) -> int:
        acted = 0
        for target in resolve(orch, job_ids):
            done = await target.slice.force_status(status, force=force, keep_going=keep_going)
            acted += done.acted
            if not done.acted:
                click.echo(f"job {target.label}: nothing to mark ({target.job.status.value})")
            else:
                click.echo(_said(target, done, f"marked {status}"))
        return acted

    _end(run(home, body))


@cli.command()
@job_ids_argument
@click.option("--timeout", type=float, default=None, help="Give up waiting after this many seconds (exit 1).")
@home_option
def merge(job_ids: Sequence[Named], timeout: float | None, home: Path | None) -> None:
    """Run the postprocessors of ended masters (ID...) again over every subjob, and wait for them: mergers
    replace their own earlier output. (They also run again by themselves once resubmitted subjobs end.)
    Exit 1 when a postprocessor failed (the line says why)."""

    async def body(orch: Orchestrator) -> int:
        targets = resolve(orch, job_ids)
        for target in targets:
            if target.indexes is not None:
                raise CliError(f"job {target.label}: a master's postprocessors go over all its subjobs; "
                               f"name the master ('orchestrator merge {target.job.fqid}')")
        code = 0
        for target in targets:
            job = target.job
            await job.merge()
            try:
                await job.wait(timeout=timeout)
            except TimeoutError:
                click.echo(f"job {job.fqid}: still postprocessing after {timeout:g} s")
                code = 1
                continue
            reason = f"; {render.safe(job.info.reason)}" if job.info.reason else ""
            click.echo(f"job {job.fqid}: merged; {job.status.value}{reason}")
            code = code or (1 if job.info.reason else 0)  # a postprocessor said why it failed
        return code

    click.get_current_context().exit(run(home, body))


__all__ = ["force_status", "kill", "merge", "release", "remove", "resubmit"]
