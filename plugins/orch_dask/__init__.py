"""``dask``: each run is a task on a dask.distributed cluster that runs the job wrapper on a worker.

The guide's worked example (``docs/plugins.md``), written against the plugin
SDK only. ``Backend("dask", scheduler="tcp://host:8786")`` sends runs to a
running scheduler; with no ``scheduler`` the driver starts a ``LocalCluster``
of ``workers`` processes on first use and closes it with the home. On the
worker, :func:`orchestrator.plugin.runner.run_wrapper` starts the wrapper in
its own process group and keeps its pid by the run's key in a control dir
that the orchestrator sees too (the home's, so workers share its filesystem,
as with ``slurm``); a kill is asked for by key there and cancels the task.
Status is the wrapper's log (``status_from_log``), polled in bulk: the
wrapper's protocol, retries and classification are those of ``local``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.plugin import (
    Capabilities,
    Driver,
    DriverContext,
    RunHandle,
    RunSpec,
    Settings,
    SettingsError,
    StatusUpdate,
    SubmitOutcome,
)
from orchestrator.plugin.accounts import Account, AccountError, account_of, give
from orchestrator.plugin.runner import request_kill, run_wrapper, running_pid
from orchestrator.plugin.wrapper import install_scripts, pid_alive, prepare_runs, read_log, status_from_log


@dataclasses.dataclass(frozen=True)
class DaskSettings(Settings):
    #: A running scheduler's address; empty: a LocalCluster of this home's own.
    scheduler: str = ""
    #: Worker processes of that LocalCluster.
    workers: int = 2
    shell: str = "/bin/sh"

    def check(self) -> None:
        if self.workers < 1:
            raise SettingsError("workers", f"workers must be at least 1, not {self.workers}")
        if self.scheduler and "://" not in self.scheduler:
            raise SettingsError("scheduler", f"scheduler must be an address such as tcp://host:8786, "
                                             f"not {self.scheduler!r}")


class DaskDriver(Driver):
    name = "dask"
    capabilities = Capabilities(bulk_submit=True, bulk_kill=True, bulk_status=True, runs_wrapper=True)
    settings = DaskSettings

    def __init__(self, context: DriverContext) -> None:
        super().__init__(context)
        self.control = context.statedir / "control"
        self.bindir = context.statedir / "bin"
        # crossed by every run's owner to the wrapper's scripts in bin/ (the control dir stays the service's)
        context.statedir.chmod(0o711)
        self._clients: dict[str, Any] = {}  # scheduler address ("" for our LocalCluster) -> Client
        self._cluster: Any = None
        self._futures: dict[str, Any] = {}  # run key -> Future
        self.calls = {"submit": 0, "kill": 0, "status": 0}

    async def _client(self, settings: Mapping[str, Any]) -> Any:
        from distributed import Client, LocalCluster  # imported when used: the extra is optional

        s = DaskSettings.of(settings)
        if s.scheduler not in self._clients:
            if s.scheduler:
                self._clients[s.scheduler] = await Client(s.scheduler, asynchronous=True)  # type: ignore[no-untyped-call]
            else:
                self._cluster = await LocalCluster(n_workers=s.workers, threads_per_worker=4, processes=True,  # type: ignore[no-untyped-call]
                                                   asynchronous=True, dashboard_address=None)
                self._clients[""] = await Client(self._cluster, asynchronous=True)  # type: ignore[no-untyped-call]
        return self._clients[s.scheduler]

    async def submit_bulk(self, runs: Sequence[RunSpec]) -> list[SubmitOutcome]:
        self.calls["submit"] += 1
        wrapper = install_scripts(self.bindir)
        accounts: dict[str | None, Account | None] = {}
        refused: dict[str, str] = {}
        for run in runs:
            if run.owner not in accounts:
                try:
                    accounts[run.owner] = account_of(run.owner)
                except AccountError as exc:
                    refused[run.owner or ""] = str(exc)
                    accounts[run.owner] = None
        runfiles = await prepare_runs(runs, bindir=self.bindir)
        client = await self._client(runs[0].settings)
        shell = DaskSettings.of(runs[0].settings).shell
        out = []
        for run, runfile in zip(runs, runfiles, strict=True):
            if (run.owner or "") in refused:
                out.append(SubmitOutcome(run.fqid, None, refused[run.owner or ""]))
                continue
            account = accounts[run.owner]
            # The worker runs as this service's user: an owner's wrapper starts with the owner's ids, in dirs of
            # the owner's.
            give(account, run.jobdir, run.outputdir, run.workdir, runfile)
            ids = None if account is None else (account.uid, account.gid, account.groups)
            (self.control / f"{run.key}.kill").unlink(missing_ok=True)
            self._futures[run.key] = client.submit(run_wrapper, shell, str(wrapper), str(runfile), str(self.control),
                                                   run.key, ids, key=run.key, pure=False)
            out.append(SubmitOutcome(run.fqid, run.key))
        return out

    async def kill_bulk(self, handles: Sequence[RunHandle]) -> list[str | None]:
        self.calls["kill"] += 1
        for h in handles:
            request_kill(self.control, h.backend_id)
            future = self._futures.pop(h.backend_id, None)
            if future is not None and not future.done() and running_pid(self.control, h.backend_id) is None:
                await future.cancel()  # not started yet: it never will
        return [None] * len(handles)

    async def status_bulk(self, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        self.calls["status"] += 1
        out = []
        for h in handles:
            future = self._futures.get(h.backend_id)
            pid = running_pid(self.control, h.backend_id)
            alive = (pid is not None and pid_alive(pid)) or (future is not None and not future.done())
            update = status_from_log(h, read_log(h.outputdir, h.attempt, fqid=h.fqid), alive=alive)
            if update is not None:
                out.append(update)
                if update.status in ("completed", "failed"):
                    self._futures.pop(h.backend_id, None)
        return out

    def metrics(self) -> dict[str, Any]:
        return {"calls": dict(self.calls), "tasks": len(self._futures)}

    async def aclose(self) -> None:
        for client in self._clients.values():
            with contextlib.suppress(Exception):  # closing what may already be gone
                await client.close()
        if self._cluster is not None:
            with contextlib.suppress(Exception):
                await self._cluster.close()
