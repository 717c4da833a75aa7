"""The conformance kit for backend plugins: one contract, checked the same way on every backend.

A plugin author subclasses :class:`BackendConformance` in a test module and overrides the fixture
``conformance_backend`` to return the ``Backend(...)`` to check; pytest then runs every check of the kit
on it. Each check applies by the capabilities the driver *declares* and skips, saying why, otherwise::

    from orchestrator import Backend
    from orchestrator.plugin.testing import BackendConformance

    class TestMineConformance(BackendConformance):
        @pytest.fixture
        def conformance_backend(self) -> Backend:
            return Backend("mine", queue="short")

Optional hooks (class attributes and fixtures of the subclass):

- ``executes`` (``True``): the backend runs the job's program (``sim`` runs none: the checks of files,
  exit codes and executions skip);
- ``survives_restart`` (``True``): runs outlive the orchestrator's process and a reopened home finds
  them by backend id (a plugin whose runs are its process's children sets ``False``: the SIGKILL checks skip);
- ``config``: settings merged into every orchestrator the kit opens (``{"core": {...}}``);
- ``timeout``: seconds a check waits for a job (60);
- ``config_for(check)``: extra orchestrator settings for one check (``"lost"``: a driver's command timeout);
- ``settings_for(check)``: extra backend settings for one check (``"kill"``, ``"resubmit"``, ``"hold"``,
  ``"lost"``, ``"crash"``; ``sim`` sets its run times and outcomes there);
- fixture ``conformance_outage``: an :class:`Outage` (``down(home)``, ``up(home)``) that makes the
  backend unreachable for a while, or ``None`` (the default: the check skips);
- fixture ``conformance_side``: a directory every run may write (default: a fresh one under
  ``tmp_path``), where runs leave a line per execution so that the kit counts them.

The module is also a pytest plugin (``-p orchestrator.plugin.testing``, or ``pytest_plugins`` in a
``conftest.py``): it registers the ``conformance`` marker that every check carries. The checks go
through the public API only (``Orchestrator``, ``Job``...), and a subprocess for the SIGKILL ones.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar, Protocol

import anyio
import pytest

from orchestrator import ArgSplitter, Backend, Executable, Job, Orchestrator, RetryPolicy, plugins
from orchestrator.plugin import Capabilities

__all__ = ["BackendConformance", "Outage"]

#: No automatic retry: each check's outcomes are the backend's own.
NO_RETRY = RetryPolicy(max_early=0, max_late_handled=0, max_late_unhandled=0)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "conformance: a check of the backend conformance kit")


class Outage(Protocol):
    """A way to make the backend unreachable (``down``) and reachable again (``up``) while runs go on."""

    def down(self, home: Path) -> None: ...

    def up(self, home: Path) -> None: ...


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _lines(path: Path) -> int:
    try:
        return len(path.read_text().split())
    except FileNotFoundError:
        return 0


@pytest.mark.conformance
@pytest.mark.anyio
class BackendConformance:
    """The checks; see the module docstring. Subclass it as ``Test...`` and override ``conformance_backend``."""

    executes: ClassVar[bool] = True
    survives_restart: ClassVar[bool] = True
    config: ClassVar[dict[str, Any]] = {}
    timeout: ClassVar[float] = 60.0

    # ------------------------------------------------------------ hooks
    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    @pytest.fixture
    def conformance_backend(self) -> Backend:
        raise NotImplementedError(f"{type(self).__name__} must override the fixture conformance_backend")

    @pytest.fixture
    def conformance_outage(self) -> Outage | None:
        return None

    @pytest.fixture
    def conformance_side(self, tmp_path: Path) -> Path:
        side = tmp_path / "side"
        side.mkdir(mode=0o777)
        side.chmod(0o777)
        return side

    def settings_for(self, check: str) -> dict[str, Any]:
        """Extra backend settings for one check; none by default."""
        return {}

    # ------------------------------------------------------------ helpers
    def caps(self, backend: Backend, check: str = "") -> Capabilities:
        """What the driver declares for these settings."""
        settings = {**backend.settings, **self.settings_for(check)}
        driver = plugins.driver_class(backend.name)
        # Declared, never detected: read from the class (capabilities_for answers from its settings alone).
        caps: Capabilities = driver.capabilities_for(driver, settings)  # type: ignore[arg-type]
        return caps

    def need(self, ok: bool, why: str) -> None:
        if not ok:
            pytest.skip(why)

    def need_execution(self) -> None:
        self.need(self.executes, "the backend runs no program (executes = False)")

    def need_wrapper(self, backend: Backend, what: str) -> None:
        self.need(self.caps(backend).runs_wrapper, f"{what} is read from the job wrapper's log; "
                                                   f"{backend.name} declares no runs_wrapper")

    def need_wrapped(self, backend: Backend, what: str) -> None:
        """The backend runs programs, through the job wrapper: ``what`` is read from the wrapper's log."""
        self.need_execution()
        self.need_wrapper(backend, what)

    def settings(self, backend: Backend, check: str) -> Backend:
        return Backend(backend.name, **{**backend.settings, **self.settings_for(check)})

    def job(self, backend: Backend, check: str, script: str, n: int, **kw: Any) -> Job:
        """``n`` subjobs of ``/bin/sh -c script i`` (``$0`` is the index ``i``)."""
        kw.setdefault("retry", NO_RETRY)
        return Job(name=f"conformance-{check}", application=Executable("/bin/sh", args=["-c", script, "-"]),
                   splitter=ArgSplitter([["-c", script, str(i)] for i in range(n)]),
                   backend=self.settings(backend, check), **kw)

    def config_for(self, check: str) -> dict[str, Any]:
        """Extra orchestrator settings for one check (a driver's ``[backends.NAME]`` table); none by default."""
        return {}

    def orch_config(self, check: str = "", **core: Any) -> dict[str, Any]:
        config = _merge(_merge({"core": {"poll_interval": 0.05}}, self.config), self.config_for(check))
        return _merge(config, {"core": core} if core else {})

    @asynccontextmanager
    async def opened(self, home: Path, check: str = "", **core: Any) -> AsyncIterator[Orchestrator]:
        async with Orchestrator(home=home, config=self.orch_config(check, **core)) as orch:
            yield orch

    async def until(self, ok: Callable[[], bool], what: str, timeout: float | None = None) -> None:
        with anyio.move_on_after(timeout or self.timeout) as scope:
            while not ok():
                await anyio.sleep(0.05)
        if scope.cancelled_caught:
            pytest.fail(f"timed out after {timeout or self.timeout:.0f} s waiting until {what}")

    async def run(self, orch: Orchestrator, job: Job, keep_going: bool = True) -> Job:
        j = await orch.jobs.add(job)
        await j.submit(keep_going=keep_going)
        await j.wait(timeout=self.timeout)
        return j

    @staticmethod
    def statuses(j: Job) -> list[str]:
        return [s.status.value for s in j.subjobs]

    @staticmethod
    def reasons(j: Job) -> list[str | None]:
        return [s.info.reason for s in j.subjobs]

    # ------------------------------------------------------------ submission
    async def test_bulk_submit_of_many_runs(self, conformance_backend: Backend, tmp_path: Path) -> None:
        """Many runs go in one bulk call where the driver declares bulk_submit (emulated otherwise); all end."""
        n = 8
        caps = self.caps(conformance_backend)
        async with self.opened(tmp_path / "home") as orch:
            seen: list[Any] = []

            async def record() -> None:
                async for ev in orch.events():
                    if type(ev).__name__ == "SubmitOutcomes":
                        seen.append(ev)

            async with anyio.create_task_group() as tg:
                tg.start_soon(record)
                await anyio.sleep(0.01)  # subscribed
                j = await self.run(orch, self.job(conformance_backend, "bulk", 'echo "run $0"', n))
                tg.cancel_scope.cancel()
            assert self.statuses(j) == ["completed"] * n, self.reasons(j)
            assert j.status == "completed"
            accepted = sum(len(ev.accepted) for ev in seen)
            assert accepted == n
            assert all(ev.native == caps.bulk_submit for ev in seen)
            if caps.bulk_submit:
                assert len(seen) == 1, f"{len(seen)} bulk calls for {n} runs"
            if self.executes:
                for s in j.subjobs:
                    assert (s.outputdir / "stdout").read_text() == f"run {s.fqid.split('.')[1]}\n"

    # ------------------------------------------------------------ files
    async def test_input_files_reach_the_run_and_output_patterns_deliver_them(
            self, conformance_backend: Backend, tmp_path: Path) -> None:
        self.need_execution()
        data = tmp_path / "data.dat"
        data.write_text("input payload\n")
        script = 'cat data.dat > "result.$0.txt"; echo "seen by $0" >> "result.$0.txt"'
        async with self.opened(tmp_path / "home") as orch:
            j = await self.run(orch, self.job(conformance_backend, "files", script, 2, inputfiles=[str(data)],
                                              outputfiles=["result.*.txt", "*.dat"]))
            assert self.statuses(j) == ["completed"] * 2, self.reasons(j)
            for i, s in enumerate(j.subjobs):
                assert (s.outputdir / f"result.{i}.txt").read_text() == f"input payload\nseen by {i}\n"
                delivered = s.outputdir / "data.dat"  # the input matched by "*.dat": its content, not a link
                assert delivered.is_file() and not delivered.is_symlink(), sorted(os.listdir(s.outputdir))
                assert delivered.read_text() == "input payload\n"
            assert data.read_text() == "input payload\n"  # the input itself untouched

    async def test_missing_output_fails_unless_turned_off(self, conformance_backend: Backend,
                                                          tmp_path: Path) -> None:
        self.need_wrapped(conformance_backend, "an output pattern that matched nothing")
        script = "echo made > made.txt"
        async with self.opened(tmp_path / "home") as orch:
            strict = await self.run(orch, self.job(conformance_backend, "output", script, 1,
                                                   outputfiles=["made.txt", "missing-*.txt"]))
            lenient = await self.run(orch, self.job(conformance_backend, "output", script, 1,
                                                    outputfiles=["made.txt", "missing-*.txt"],
                                                    fail_on_missing_output=False))
            assert self.statuses(strict) == ["failed"]
            assert "missing-*.txt" in (strict.subjobs[0].info.reason or "")
            assert self.statuses(lenient) == ["completed"], self.reasons(lenient)
            for j in (strict, lenient):
                assert (j.subjobs[0].outputdir / "made.txt").read_text() == "made\n"

    # ------------------------------------------------------------ outcomes
    async def test_exit_codes_keywords_and_stderr_in_reasons(self, conformance_backend: Backend,
                                                             tmp_path: Path) -> None:
        self.need_execution()
        wrapper = self.caps(conformance_backend).runs_wrapper
        script = ('case $0 in 1) echo "boom-$0" >&2; exit 3 ;; 2) $ORCH_LOG FAILED bad-data-$0 ;; '
                  '3) $ORCH_LOG SUCCEEDED out ;; esac; exit 0')
        async with self.opened(tmp_path / "home") as orch:
            j = await self.run(orch, self.job(conformance_backend, "outcomes", script, 4 if wrapper else 2))
            got = self.statuses(j)
            assert got[:2] == ["completed", "failed"], self.reasons(j)
            assert j.status == "failed"
            reason = j.subjobs[1].info.reason or ""
            assert "3" in reason
            if wrapper:
                assert "boom-1" in reason, reason  # the stderr tail
                assert got[2:] == ["failed", "completed"], self.reasons(j)
                assert "bad-data-2" in (j.subjobs[2].info.reason or "")
            assert (j.subjobs[1].outputdir / "stderr").read_text() == "boom-1\n"

    # ------------------------------------------------------------ kill, resubmit, hold
    async def test_kill_one_running_subjob_then_the_master(self, conformance_backend: Backend,
                                                          tmp_path: Path) -> None:
        async with self.opened(tmp_path / "home") as orch:
            j = await orch.jobs.add(self.job(conformance_backend, "kill", "sleep 60", 2))
            await j.submit(keep_going=True)
            await self.until(lambda: self.statuses(j) == ["running"] * 2, "every subjob runs")
            await j.subjobs[1].kill()
            await self.until(lambda: j.subjobs[1].status == "killed", "the subjob killed is killed")
            assert j.subjobs[0].status == "running" and j.status == "running"
            await j.kill()
            await j.wait(timeout=self.timeout)
            assert self.statuses(j) == ["killed"] * 2 and j.status == "killed"

    async def test_resubmit_of_failed_runs(self, conformance_backend: Backend, tmp_path: Path) -> None:
        self.need(self.executes or bool(self.settings_for("resubmit")),
                  "the backend runs no program and settings_for('resubmit') makes no run fail")
        # Subjob 1 fails on its first attempt only (a later attempt, or its work dir kept, says it tried).
        script = ('if [ "$0" = 1 ]; then if [ "${ORCH_ATTEMPT:-1}" -gt 1 ] || [ -e tried ]; then exit 0; fi; '
                  "touch tried; exit 3; fi")
        async with self.opened(tmp_path / "home") as orch:
            j = await self.run(orch, self.job(conformance_backend, "resubmit", script, 3))
            assert self.statuses(j) == ["completed", "failed", "completed"], self.reasons(j)
            await j.resubmit()
            await j.wait(timeout=self.timeout)
            assert self.statuses(j) == ["completed"] * 3, self.reasons(j)
            assert [s.info.submit_counter for s in j.subjobs] == [1, 2, 1]

    async def test_hold_and_release(self, conformance_backend: Backend, tmp_path: Path) -> None:
        holds = bool(self.settings_for("hold"))
        if not holds:
            self.need_wrapped(conformance_backend, "HOLD")
        script = 'if [ -z "${ORCH_RETRY_ARG_1:-}" ]; then $ORCH_LOG HOLD wait-for-me; fi; echo "arg=$ORCH_RETRY_ARG_1"'
        async with self.opened(tmp_path / "home") as orch:
            j = await self.run(orch, self.job(conformance_backend, "hold", script, 1))
            assert self.statuses(j) == ["held"] and j.status == "held", self.reasons(j)
            await j.subjobs[0].release(["go"])
            await j.wait(timeout=self.timeout)
            assert self.statuses(j) == ["completed"], self.reasons(j)
            if not holds:
                assert (j.subjobs[0].outputdir / "stdout").read_text() == "arg=go\n"

    # ------------------------------------------------------------ checkpoints and usage
    async def test_checkpoint_states_harvested_at_the_end(self, conformance_backend: Backend,
                                                          tmp_path: Path) -> None:
        self.need_wrapped(conformance_backend, "a checkpoint state")
        script = "i=0; while [ $i -lt 6 ]; do i=$((i+1)); $ORCH_STATE save-value i $i; $ORCH_STATE save; done"
        async with self.opened(tmp_path / "home") as orch:
            j = await self.run(orch, self.job(conformance_backend, "states", script, 2))
            assert self.statuses(j) == ["completed"] * 2, self.reasons(j)
            for s in j.subjobs:
                assert s.info.checkpoint.get("label") == f"{s.fqid}:6", s.info.checkpoint
                states = await s.states()
                assert states and f"{s.fqid}:6" in states[-1]["data"]

    async def test_checkpoint_harvested_while_running_and_resumed(self, conformance_backend: Backend,
                                                                  tmp_path: Path) -> None:
        self.need_wrapped(conformance_backend, "a checkpoint state")
        # The first attempt saves i=1..3 and waits; a later one goes on from the state it starts from.
        script = ('i=$($ORCH_STATE get i); i=${i:-0}; echo "from $i"; '
                  "while [ $i -lt 3 ] || { [ $ORCH_ATTEMPT -gt 1 ] && [ $i -lt 6 ]; }; do "
                  "i=$((i+1)); $ORCH_STATE save-value i $i; $ORCH_STATE save; done; "
                  "if [ $ORCH_ATTEMPT = 1 ]; then sleep 60; fi")
        async with self.opened(tmp_path / "home") as orch:
            j = await orch.jobs.add(self.job(conformance_backend, "resume", script, 1))
            await j.submit()
            s = j.subjobs[0]
            await self.until(lambda: s.info.checkpoint.get("label") == f"{s.fqid}:3",
                             "the third state is harvested while the run goes on")
            assert s.status == "running"
            saved = await s.states()
            await s.kill()
            await j.wait(timeout=self.timeout)
            await s.resubmit(from_state=saved[-1]["data"])
            await j.wait(timeout=self.timeout)
            assert s.status == "completed", s.info.reason
            assert (s.outputdir / "stdout").read_text().splitlines()[0] == "from 3"  # (save prints labels)
            newest = (await s.states())[-1]["data"]
            assert f"{s.fqid}:{s.info.checkpoint['seq']}" in newest and "6" in newest, newest

    async def test_usage_records_one_per_attempt(self, conformance_backend: Backend, tmp_path: Path) -> None:
        self.need_wrapped(conformance_backend, "a usage record")
        async with self.opened(tmp_path / "home") as orch:
            j = await self.run(orch, self.job(conformance_backend, "usage", "exit $0", 2))
            assert self.statuses(j) == ["completed", "failed"]
            await j.subjobs[1].resubmit()
            await j.wait(timeout=self.timeout)
            for s, attempts in zip(j.subjobs, ([1], [1, 2]), strict=True):
                text = (s.outputdir / "orch.usage").read_text()
                records = [line.split() for line in text.splitlines() if len(line.split()) == 6]
                assert [int(r[0]) for r in records] == attempts, text

    # ------------------------------------------------------------ crashes and outages
    def crash(self, home: Path, backend: Backend, side: Path, n: int, when: str) -> tuple[str, int]:
        self.need(self.survives_restart, "the plugin's runs end with the orchestrator's process "
                                         "(survives_restart = False)")
        script = f"echo $0 >> {shlex.quote(str(side))}/$0; sleep 3"
        spec = {"home": str(home), "config": self.orch_config("crash"), "script": script, "n": n, "when": when,
                "backend": backend.name, "settings": {**backend.settings, **self.settings_for("crash")},
                "timeout": self.timeout}
        out = subprocess.run([sys.executable, "-m", "orchestrator.plugin.testing._crash", json.dumps(spec)],
                             capture_output=True, text=True, timeout=self.timeout + 30)
        assert out.returncode == -9, f"the orchestrator was not SIGKILLed: {out.returncode}\n{out.stderr[-3000:]}"
        return out.stdout, n

    async def reopened_without_loss(self, home: Path, backend: Backend, side: Path, n: int) -> None:
        """Reopened: every run recorded goes on to its end, once. Runs a crash caught mid-submission are adopted
        or sent again by key (``lookup``), else left ``new`` with a reason, sent by nobody but the user."""
        async with self.opened(home, "crash") as orch:
            j = orch.jobs[0]
            if not j.subjobs:  # caught before any subjob was recorded: the master is new again
                await j.submit(keep_going=True)
            await j.wait(timeout=self.timeout)
            left = [s for s in j.subjobs if s.status == "new"]
            if self.caps(backend, "crash").lookup:
                assert not left, f"runs left new although the driver declares lookup: {self.reasons(j)}"
            for s in left:
                assert "resubmit" in (s.info.reason or ""), s.info.reason
            done = [s for s in j.subjobs if s.status != "new"]
            assert [s.status.value for s in done] == ["completed"] * len(done), self.reasons(j)
            ran = {i: _lines(side / str(i)) for i in range(n)}
            if self.executes:
                assert all(ran[int(s.fqid.split(".")[1])] == 1 for s in done), ran
                assert all(ran[int(s.fqid.split(".")[1])] <= 1 for s in left), ran  # never sent behind one's back
            if left:  # the user decides: sends them
                for s in left:
                    await s.resubmit()
                await j.wait(timeout=self.timeout)
            assert self.statuses(j) == ["completed"] * n, self.reasons(j)

    async def test_orchestrator_killed_mid_run_then_reopened(self, conformance_backend: Backend, tmp_path: Path,
                                                             conformance_side: Path) -> None:
        out, n = self.crash(tmp_path / "home", conformance_backend, conformance_side, 2, "running")
        assert "running" in out
        await self.reopened_without_loss(tmp_path / "home", conformance_backend, conformance_side, n)

    async def test_orchestrator_killed_mid_submission_then_reopened(
            self, conformance_backend: Backend, tmp_path: Path, conformance_side: Path) -> None:
        _, n = self.crash(tmp_path / "home", conformance_backend, conformance_side, 3, "submission")
        await self.reopened_without_loss(tmp_path / "home", conformance_backend, conformance_side, n)

    async def test_unreachable_backend_runs_are_lost_and_retried(
            self, conformance_backend: Backend, tmp_path: Path, conformance_outage: Outage | None) -> None:
        self.need(conformance_outage is not None, "the test module gives no way to make the backend unreachable "
                                                  "(fixture conformance_outage)")
        assert conformance_outage is not None
        home = tmp_path / "home"
        retry = RetryPolicy(max_early=0, max_late_handled=0, max_late_unhandled=3, early_seconds=0)
        async with self.opened(home, "lost", lost_after_seconds=1.0) as orch:
            j = await orch.jobs.add(self.job(conformance_backend, "lost", "sleep 3", 2, retry=retry))
            await j.submit(keep_going=True)
            await self.until(lambda: self.statuses(j) == ["running"] * 2, "every subjob runs")
            conformance_outage.down(home)
            try:
                await self.until(lambda: all(s.info.history for s in j.subjobs), "both runs are lost")
            finally:
                conformance_outage.up(home)
            await j.wait(timeout=self.timeout)
            assert self.statuses(j) == ["completed"] * 2, self.reasons(j)
            for s in j.subjobs:
                assert s.info.history[0]["level"] == "orchestrator", s.info.history
                assert s.info.submit_counter >= 2

