"""The ssh driver's lookup: where runs caught mid-submission by a crash stand, one remote command per host.

A run's backend id is ``key@host``, and its key names its run dir on the
host (``runs/<key>``), so a fresh driver finds a run by asking every host
its settings name about that dir: one command per host for all the keys
(:func:`orch_ssh.scripts.lookup`). A run that is not on a host is fenced
there before the answer says so: the submission that was under way when the
orchestrator died may still be running on the host, and must not prepare or
start the run after the core has been told it can send it again (maybe to
another host). The fence's token stays with the :class:`~orch_ssh.host.Host`
until the run is submitted again there.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import anyio

from orchestrator.plugin import RunSpec

from . import scripts
from .host import Host, HostError, RemoteFailed
from .placement import SshBase, _backend_id

#: What the lookup script answers per key (``E``: the host could not fence it: no answer).
LAUNCHED, PREPARED, ABSENT = "L", "P", "N"


class LookupMixin(SshBase):
    """Finding runs by key after a restart."""

    async def lookup(self, runs: Sequence[RunSpec]) -> list[str | None]:
        """Each run's ``key@host`` if a host of its settings got it, else ``None`` (fenced on every host).

        Raises :class:`HostError` when a run is found nowhere but some host of its
        settings could not be asked (or could not fence it): it may be there.
        """
        token = secrets.token_hex(8)
        plan: dict[Host, list[str]] = {}
        hosts_of: list[list[Host]] = []
        for run in runs:
            hosts = [self._host(run.settings, label, run.owner) for label in run.settings["hosts"]]
            hosts_of.append(hosts)
            for host in hosts:
                keys = plan.setdefault(host, [])
                if run.key not in keys:
                    keys.append(run.key)
        answers: dict[Host, dict[str, str]] = {}
        errors: dict[Host, HostError] = {}
        async with anyio.create_task_group() as tg:
            for host, keys in plan.items():
                tg.start_soon(self._lookup_host, host, keys, token, answers, errors)
        result: list[str | None] = []
        for run, hosts in zip(runs, hosts_of, strict=True):
            said = {h: answers[h].get(run.key) for h in hosts if h in answers}
            found = [h for h, w in said.items() if w == LAUNCHED] or [h for h, w in said.items() if w == PREPARED]
            if found:
                result.append(_backend_id(run.key, found[0].label))
                continue
            unsure = [h for h in hosts if said.get(h) != ABSENT]
            if unsure:
                why = "; ".join(str(errors[h]) if h in errors else f"{h.label}: no answer about {run.key}"
                                for h in unsure)
                raise HostError(f"cannot tell whether run {run.key} reached its hosts: {why}")
            result.append(None)
        return result

    async def _lookup_host(self, host: Host, keys: list[str], token: str, answers: dict[Host, dict[str, str]],
                           errors: dict[Host, HostError]) -> None:
        """Ask ``host`` about ``keys`` in one command; its answers, or its error in ``errors``."""
        try:
            out = await host.command("lookup", scripts.lookup(host.base, keys, token))
        except HostError as exc:
            errors[host] = exc
            return
        lines = out.decode(errors="replace").splitlines()
        if "OK" not in lines:
            errors[host] = RemoteFailed(f"lookup on {host.label} ended early: {out[-200:]!r}")
            return
        said: dict[str, str] = {}
        for line in lines:
            w = line.split()
            if len(w) == 2 and w[0] in (LAUNCHED, PREPARED, ABSENT):
                said[w[1]] = w[0]
                if w[0] == ABSENT:
                    host.fences[w[1]] = token
        answers[host] = said
