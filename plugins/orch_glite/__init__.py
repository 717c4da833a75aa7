"""``glite``: real bulk submission to a gLite-style WMS (the emulator in :mod:`orch_glite.wms`).

Why this backend: it is the one built-in backend whose bulk abilities are
native and remote, as in Ganga's gLite case: a master's subjobs go to the
service as one collection in one call, the status of a whole collection
comes back from one call per monitoring tick, and a kill is one call
whatever the number of runs. Single-subjob resubmission is not a native
operation of a collection (``Capabilities.resubmit`` is False): a batch of
one run is sent as a one-node submission, so a master can have subjobs in
its original collection and others resubmitted alone, and a later bulk kill
reaches both kinds in one call. A batch of several runs (a master's first
submission, ``master.resubmit()`` of many failed subjobs, automatic retries
of one tick) is one new collection.

Runs go through the job wrapper on the WMS's machine, which shares this
file system: the WMS writes each run's ``stdout``, ``stderr``, ``orch.<attempt>.log``
and output files into the run's ``outputdir``, where the core reads them
(``runs_wrapper=True``); nothing has to be fetched.

Faults: a node the WMS rejects at submission is an error in its
:class:`SubmitOutcome` (the core makes it ``failed``); a node the WMS aborts
later is reported ``failed`` with ``backend_verdict="aborted"``; a service
that cannot be reached, or answers something that is not the protocol,
makes :meth:`GliteDriver.status_bulk` raise, after a warning naming the
jobs concerned, and the core treats that as a backend fault (backoff, and
nothing is failed until ``lost_after_seconds``). Submissions and cancels
whose answer was lost are retried with the same request id: the WMS answers
a repeated request as the first time and never creates a node twice.

After a crash, :meth:`GliteDriver.lookup` asks the WMS in one call per
endpoint which of the runs caught mid-submission it has a node for (the
WMS knows each node by its run's key). The keys it has none for are fenced
at a new epoch, which this driver then sends with its submissions: a
submission still in flight from before the crash, older than the fence, can
no longer create the node after the WMS said there was none.

Settings, ``Backend("glite", ...)``:

- ``endpoint``: ``"http://127.0.0.1:PORT"`` (loopback only); default ``[backends.glite] endpoint``.
- ``timeout`` (seconds per call, default 10), ``retries`` (of a submission or cancel whose
  answer was lost or garbled, default 2), ``shell`` (default ``/bin/sh``).
- fault injection, sent with each submission and applied by the WMS to that collection:
  ``reject=[k, ...]``, ``abort={k: seconds}``, ``status_delay=seconds``,
  ``drop={"submit" | "status" | "cancel": n}``, ``garbage={...: n}``
  (see :mod:`orch_glite.protocol`).

Written against the public driver API only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from orchestrator.plugin import (
    Capabilities,
    Driver,
    DriverContext,
    JobStatus,
    RunHandle,
    RunSpec,
    SettingsError,
    StatusUpdate,
    SubmitError,
    SubmitOutcome,
)

from .protocol import (
    FAULT_KEYS,
    NODE_STATES,
    WMSError,
    WMSFault,
    WMSGarbage,
    WMSUnavailable,
    call,
    check_faults,
    node_spec,
    parse_endpoint,
)

__all__ = ["GliteDriver"]

DEFAULT_TIMEOUT = 10.0
DEFAULT_RETRIES = 2
#: Status calls (one per collection) in flight at once within one tick.
STATUS_CONCURRENCY = 8
_SETTINGS = ("endpoint", "timeout", "retries", "shell", *FAULT_KEYS)
#: Statuses in which a report of the run's ending is still news to the core.
_WATCHING = frozenset({JobStatus.SUBMITTED, JobStatus.RUNNING, JobStatus.COMPLETING})


class GliteDriver(Driver):
    name = "glite"
    capabilities = Capabilities(bulk_submit=True, bulk_kill=True, bulk_status=True, runs_wrapper=True, lookup=True)

    def __init__(self, context: DriverContext) -> None:
        super().__init__(context)
        self.default_endpoint: str | None = context.config.get("endpoint")
        #: HTTP requests made, by kind (retries included), so tests can count round trips.
        self.calls: dict[str, int] = {"submit_collection": 0, "submit_node": 0, "status": 0, "cancel": 0,
                                      "lookup": 0}
        #: Endpoint -> the highest epoch a lookup was answered there; sent with every submission.
        self._epochs: dict[str, int] = {}

    def metrics(self) -> dict[str, Any]:
        """Calls made to the WMS, by kind (``submit_collection``, ``submit_node``, ``status``, ``cancel``...)."""
        return {"calls": dict(self.calls)}

    # ------------------------------------------------------------ settings
    @classmethod
    def validate_settings(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        for key in settings:
            if key not in _SETTINGS:
                raise SettingsError(key, f"backend 'glite' takes no setting {key!r} (it takes {', '.join(_SETTINGS)})")
        out: dict[str, Any] = {}
        if "endpoint" in settings:
            try:
                parse_endpoint(settings["endpoint"])
            except ValueError as exc:
                raise SettingsError("endpoint", str(exc)) from None
            out["endpoint"] = settings["endpoint"]
        if "timeout" in settings:
            t = settings["timeout"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
                raise SettingsError("timeout", f"timeout must be a number of seconds > 0, not {t!r}")
            out["timeout"] = float(t)
        if "retries" in settings:
            r = settings["retries"]
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= 10:
                raise SettingsError("retries", f"retries must be an integer from 0 to 10, not {r!r}")
            out["retries"] = r
        if "shell" in settings:
            sh = settings["shell"]
            if not isinstance(sh, str) or not sh.startswith("/"):
                raise SettingsError("shell", f"shell must be the absolute path of a POSIX sh, not {sh!r}")
            out["shell"] = sh
        out.update(check_faults({k: settings[k] for k in FAULT_KEYS if k in settings}))
        return out

    def _endpoint(self, settings: Mapping[str, Any]) -> str:
        endpoint = settings.get("endpoint") or self.default_endpoint
        if not endpoint:
            raise WMSUnavailable("no WMS endpoint: set Backend('glite', endpoint=...) or [backends.glite] endpoint")
        return str(endpoint)

    @staticmethod
    def _timeout(settings: Mapping[str, Any]) -> float:
        return float(settings.get("timeout", DEFAULT_TIMEOUT))

    @staticmethod
    def _faults(settings: Mapping[str, Any]) -> dict[str, Any]:
        return {k: settings[k] for k in FAULT_KEYS if k in settings}

    async def _call(self, kind: str, settings: Mapping[str, Any], method: str, path: str, document: Any,
                    who: Sequence[str], *, retry: bool) -> Any:
        """One protocol call; an idempotent one is retried when its answer was lost or garbled."""
        endpoint = self._endpoint(settings)
        attempts = 1 + (int(settings.get("retries", DEFAULT_RETRIES)) if retry else 0)
        for attempt in range(attempts):
            self.calls[kind] += 1
            try:
                return await call(endpoint, method, path, document, timeout=self._timeout(settings))
            except (WMSUnavailable, WMSGarbage) as exc:
                if attempt + 1 >= attempts:
                    raise
                self.context.log.warning("WMS call failed, retrying with the same request id", request=kind,
                                         error=str(exc), attempt=attempt + 1, **_who(who))
                await anyio.sleep(min(0.1 * 2 ** attempt, 2.0))
        raise AssertionError("unreachable")

    # -------------------------------------------------------------- submit
    async def submit(self, run: RunSpec) -> str:
        """A single-node submission (how a run resubmitted alone reaches the WMS)."""
        outcome = await self._submit_node(run)
        if not outcome.ok:
            raise SubmitError(outcome.error or "glite: rejected")
        assert outcome.backend_id is not None
        return outcome.backend_id

    async def submit_bulk(self, runs: Sequence[RunSpec]) -> list[SubmitOutcome]:
        """Many runs: one collection per endpoint (normally one call); a batch of one: a one-node submission."""
        if len(runs) == 1:
            return [await self._submit_node(runs[0])]
        groups: dict[str, list[int]] = {}
        for i, run in enumerate(runs):
            groups.setdefault(self._endpoint_or_empty(run.settings), []).append(i)
        outcomes: list[SubmitOutcome | None] = [None] * len(runs)
        for indexes in groups.values():
            batch = [runs[i] for i in indexes]
            for i, outcome in zip(indexes, await self._submit_collection(batch), strict=True):
                outcomes[i] = outcome
        return [o for o in outcomes if o is not None]

    async def _submit_node(self, run: RunSpec) -> SubmitOutcome:
        """The WMS's word on one run (a refusal is an outcome); raises ``SubmitError`` if no word came."""
        epoch = self._epoch(run.settings)
        document = {"request": _request_id([run.key], epoch), "node": node_spec(run, _shell(run.settings)),
                    "faults": self._faults(run.settings), "epoch": epoch}
        try:
            answer = await self._call("submit_node", run.settings, "POST", "/v1/nodes", document, [run.fqid],
                                      retry=True)
            cid, nid, error = _node_answer(answer)
        except WMSFault as exc:
            self.context.log.warning("WMS submission failed", fqid=run.fqid, error=str(exc))
            raise SubmitError(f"glite: submission failed: {exc}") from None
        if error is not None:
            self.context.log.warning("WMS rejected the node", fqid=run.fqid, reason=error)
            return SubmitOutcome(run.fqid, None, f"glite: {error}")
        return SubmitOutcome(run.fqid, f"{cid}/{nid}")

    def _endpoint_or_empty(self, settings: Mapping[str, Any]) -> str:
        return str(settings.get("endpoint") or self.default_endpoint or "")

    def _epoch(self, settings: Mapping[str, Any]) -> int:
        return self._epochs.get(self._endpoint_or_empty(settings), 0)

    async def _submit_collection(self, runs: Sequence[RunSpec]) -> list[SubmitOutcome]:
        settings = runs[0].settings
        epoch = self._epoch(settings)
        document = {"request": _request_id([r.key for r in runs], epoch),
                    "nodes": [node_spec(r, _shell(r.settings)) for r in runs],
                    "faults": self._faults(settings), "epoch": epoch}
        fqids = [r.fqid for r in runs]
        try:
            answer = await self._call("submit_collection", settings, "POST", "/v1/collections", document, fqids,
                                      retry=True)
            cid, entries = _collection_answer(answer, [r.key for r in runs])
        except WMSFault as exc:
            self.context.log.warning("WMS collection submission failed", error=str(exc), **_who(fqids))
            raise SubmitError(f"glite: collection submission failed: {exc}") from None
        outcomes = []
        for run, (nid, holder, error) in zip(runs, entries, strict=True):
            if error is not None or nid is None:
                outcomes.append(SubmitOutcome(run.fqid, None, f"glite: {error or 'rejected'}"))
            else:
                outcomes.append(SubmitOutcome(run.fqid, f"{holder or cid}/{nid}"))
        rejected = [r.fqid for r, o in zip(runs, outcomes, strict=True) if not o.ok]
        if rejected:
            self.context.log.warning("WMS rejected nodes", collection=cid, rejected=rejected, **_who(fqids))
        return outcomes

    # -------------------------------------------------------------- lookup
    async def lookup(self, runs: Sequence[RunSpec]) -> list[str | None]:
        """One lookup call per endpoint: each run's ``collection/node`` if the WMS has a node under its key.

        The ids are the ones :meth:`submit_bulk` returns (a node is always named with the collection
        that holds it). Keys answered ``None`` are fenced by the WMS at the epoch it answers, which
        later submissions carry; raises :class:`WMSFault` if an endpoint gave no intelligible answer.
        """
        groups: dict[str, list[int]] = {}
        for i, run in enumerate(runs):
            groups.setdefault(self._endpoint_or_empty(run.settings), []).append(i)
        result: list[str | None] = [None] * len(runs)
        for endpoint, indexes in groups.items():
            members = [runs[i] for i in indexes]
            keys = list(dict.fromkeys(r.key for r in members))
            answer = await self._call("lookup", members[0].settings, "POST", "/v1/lookup", {"keys": keys},
                                      [r.fqid for r in members], retry=True)
            epoch, nodes = _lookup_answer(answer, keys)
            self._epochs[endpoint] = max(self._epochs.get(endpoint, 0), epoch)
            for i, run in zip(indexes, members, strict=True):
                result[i] = nodes[run.key]
        return result

    # -------------------------------------------------------------- status
    async def status(self, handle: RunHandle) -> StatusUpdate | None:
        updates = await self.status_bulk([handle])
        return updates[0] if updates else None

    async def status_bulk(self, handles: Sequence[RunHandle]) -> list[StatusUpdate]:
        """One call per collection; raises :class:`WMSFault` if any collection got no intelligible answer."""
        updates: list[StatusUpdate] = []
        groups: dict[tuple[str, str], list[tuple[RunHandle, str]]] = {}
        for h in handles:
            cid, sep, nid = h.backend_id.partition("/")
            if not sep or not cid or not nid:
                updates.append(StatusUpdate(h.fqid, JobStatus.FAILED,
                                            reason=f"glite: unreadable backend id {h.backend_id!r}",
                                            backend_verdict="lost"))
                continue
            groups.setdefault((self._endpoint_or_empty(h.settings), cid), []).append((h, nid))
        faults: list[tuple[str, list[str], WMSFault]] = []
        limiter = anyio.CapacityLimiter(STATUS_CONCURRENCY)

        async def one(cid: str, members: list[tuple[RunHandle, str]]) -> None:
            async with limiter:
                try:
                    updates.extend(await self._collection_status(cid, members))
                except WMSFault as exc:
                    faults.append((cid, [h.fqid for h, _ in members], exc))

        async with anyio.create_task_group() as tg:
            for (_, cid), members in groups.items():
                tg.start_soon(one, cid, members)
        if faults:
            for cid, fqids, exc in faults:
                self.context.log.warning("WMS status query failed", collection=cid, error=str(exc), **_who(fqids))
            raise WMSFault(f"{len(faults)} of {len(groups)} status call(s) failed; first: {faults[0][2]}")
        return updates

    async def _collection_status(self, cid: str, members: list[tuple[RunHandle, str]]) -> list[StatusUpdate]:
        settings = members[0][0].settings
        self.calls["status"] += 1
        try:
            answer = await call(self._endpoint(settings), "GET", f"/v1/collections/{cid}",
                                timeout=self._timeout(settings))
        except WMSError as exc:
            if exc.status == 404 and exc.message.startswith("unknown collection"):
                return [StatusUpdate(h.fqid, JobStatus.FAILED, reason=f"glite: the WMS does not know collection {cid}",
                                     backend_verdict="lost") for h, _ in members]
            raise
        nodes = answer.get("nodes")
        if answer.get("collection") != cid or not isinstance(nodes, dict):
            raise WMSGarbage(f"status of {cid}: the answer is not a collection's status")
        updates = []
        for h, nid in members:
            entry = nodes.get(nid)
            if entry is None:
                updates.append(StatusUpdate(h.fqid, JobStatus.FAILED, reason=f"glite: the WMS does not know node {nid}",
                                            backend_verdict="lost"))
                continue
            update = _update(h, _node_entry(cid, nid, entry))
            if update is not None:
                updates.append(update)
        return updates

    # ---------------------------------------------------------------- kill
    async def kill(self, handle: RunHandle) -> None:
        error = (await self.kill_bulk([handle]))[0]
        if error is not None:
            raise RuntimeError(error)

    async def kill_bulk(self, handles: Sequence[RunHandle]) -> list[str | None]:
        """One cancel call per endpoint (normally one), across collections."""
        results: list[str | None] = [None] * len(handles)
        groups: dict[str, list[tuple[int, str]]] = {}
        for i, h in enumerate(handles):
            _, sep, nid = h.backend_id.partition("/")
            if not sep or not nid:
                results[i] = f"glite: unreadable backend id {h.backend_id!r}"
                continue
            groups.setdefault(self._endpoint_or_empty(h.settings), []).append((i, nid))
        for members in groups.values():
            settings = handles[members[0][0]].settings
            fqids = [handles[i].fqid for i, _ in members]
            try:
                answer = await self._call("cancel", settings, "POST", "/v1/cancel",
                                          {"nodes": [nid for _, nid in members]}, fqids, retry=True)
                nodes = answer.get("nodes")
                if not isinstance(nodes, dict):
                    raise WMSGarbage("cancel: the answer has no 'nodes' mapping")
            except WMSFault as exc:
                self.context.log.warning("WMS cancel failed", error=str(exc), **_who(fqids))
                raise
            for i, nid in members:
                entry = nodes.get(nid)
                if not isinstance(entry, dict):
                    results[i] = f"glite: the WMS said nothing about node {nid}"
                elif entry.get("error"):
                    results[i] = f"glite: {entry['error']}"
        return results


# ------------------------------------------------------------------ helpers
def _shell(settings: Mapping[str, Any]) -> str:
    return str(settings.get("shell", "/bin/sh"))


def _request_id(keys: Sequence[str], epoch: int = 0) -> str:
    """Stable across retries: the same runs make the same request. A lookup's epoch makes it a new one,
    so that the WMS never answers a submission sent after a lookup with a request voided before it."""
    text = "\n".join(keys) + (f"\nepoch {epoch}" if epoch else "")
    return "rq-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def _who(fqids: Sequence[str]) -> dict[str, Any]:
    """Log fields naming the jobs concerned: ``fqid`` (the run, or its top-level job(s)) and ``runs``."""
    if len(fqids) == 1:
        return {"fqid": fqids[0]}
    tops = sorted({f.split(".", 1)[0] for f in fqids}, key=lambda t: (len(t), t))
    return {"fqid": ",".join(tops), "runs": list(fqids)}


def _node_answer(answer: Mapping[str, Any]) -> tuple[str | None, str | None, str | None]:
    cid, nid, error = answer.get("collection"), answer.get("node"), answer.get("error")
    if error is not None:
        if not isinstance(error, str):
            raise WMSGarbage("submission: 'error' is not a string")
        return None, None, error
    if not isinstance(cid, str) or not isinstance(nid, str) or not cid or not nid:
        raise WMSGarbage("submission: the answer names no collection and node")
    return cid, nid, None


#: Per node: its id, the collection holding it (``None``: the answer's), or why it was rejected.
_Entries = list[tuple[str | None, str | None, str | None]]


def _collection_answer(answer: Mapping[str, Any], keys: Sequence[str]) -> tuple[str, _Entries]:
    cid, entries = answer.get("collection"), answer.get("nodes")
    if not isinstance(entries, list) or len(entries) != len(keys):
        raise WMSGarbage("submission: the answer does not have one entry per node")
    out: _Entries = []
    for key, entry in zip(keys, entries, strict=True):
        if not isinstance(entry, dict) or entry.get("key") != key:
            raise WMSGarbage("submission: the answer's entries do not match the nodes sent")
        nid, holder, error = entry.get("node"), entry.get("collection"), entry.get("error")
        if not (isinstance(nid, str) and nid and error is None) and not (nid is None and isinstance(error, str)):
            raise WMSGarbage(f"submission: entry for {key} is neither a node id nor an error")
        if holder is not None and (not isinstance(holder, str) or not holder):
            raise WMSGarbage(f"submission: entry for {key} names a malformed collection")
        if nid and not holder and (not isinstance(cid, str) or not cid):
            raise WMSGarbage("submission: nodes were accepted but no collection id came back")
        out.append((nid, holder, error))
    return str(cid or ""), out


def _lookup_answer(answer: Mapping[str, Any], keys: Sequence[str]) -> tuple[int, dict[str, str | None]]:
    """The epoch and, per key, ``collection/node`` or ``None``; anything off makes it garbage."""
    epoch, nodes = answer.get("epoch"), answer.get("nodes")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0 or not isinstance(nodes, dict):
        raise WMSGarbage("lookup: the answer has no epoch or no 'nodes' mapping")
    out: dict[str, str | None] = {}
    for key in keys:
        if key not in nodes:
            raise WMSGarbage(f"lookup: the answer says nothing about {key}")
        entry = nodes[key]
        if entry is None:
            out[key] = None
            continue
        cid, nid = (entry.get("collection"), entry.get("node")) if isinstance(entry, dict) else (None, None)
        if not isinstance(cid, str) or not isinstance(nid, str) or not cid or not nid:
            raise WMSGarbage(f"lookup: the entry for {key} names no collection and node")
        out[key] = f"{cid}/{nid}"
    return epoch, out


def _node_entry(cid: str, nid: str, entry: Any) -> dict[str, Any]:
    """Check one node's status entry; anything off makes the whole answer garbage."""
    if not isinstance(entry, dict) or entry.get("state") not in NODE_STATES:
        raise WMSGarbage(f"status of {cid}: node {nid} has no valid state")
    code, reason = entry.get("exit_code"), entry.get("reason")
    if (code is not None and (isinstance(code, bool) or not isinstance(code, int))) or \
            (reason is not None and not isinstance(reason, str)):
        raise WMSGarbage(f"status of {cid}: node {nid} has a malformed exit code or reason")
    return entry


def _update(h: RunHandle, entry: Mapping[str, Any]) -> StatusUpdate | None:
    """The news in a node's state for the core, or ``None``: only changes are reported."""
    state, code, reason = entry["state"], entry.get("exit_code"), entry.get("reason")
    if state in ("submitted", "launching"):
        return None  # still submitted as far as the core is concerned
    if h.status not in _WATCHING:
        return None  # held (the core already judged this run): nothing new can come from the WMS
    if state == "running":
        return None if h.status == JobStatus.RUNNING else StatusUpdate(h.fqid, JobStatus.RUNNING)
    if state == "done":
        if code == 0:
            return StatusUpdate(h.fqid, JobStatus.COMPLETED, exit_code=0)
        return StatusUpdate(h.fqid, JobStatus.FAILED, exit_code=code, reason=f"glite: node done with exit code {code}")
    if state == "aborted":
        return StatusUpdate(h.fqid, JobStatus.FAILED, reason=f"glite: aborted: {reason or 'by the WMS'}",
                            backend_verdict="aborted")
    return StatusUpdate(h.fqid, JobStatus.KILLED, reason=f"glite: {reason or 'cancelled'}")
