"""``ssh``: run jobs on remote hosts over SSH, through the job wrapper.

``Backend("ssh", hosts=["user@host:port", ...], key="~/.ssh/id_ed25519",
workdir="/remote/base", slots=4, known_hosts="~/.ssh/known_hosts")``.

The remote design mirrors the ``local`` driver's, so that what makes
``local`` safe across restarts holds over a network too:

* **One events file per host** (``<workdir>/<namespace>/events.log``) that
  every wrapper appends START and END lines to (``ORCH_NOTIFY``), next to
  our own INTENT / LAUNCH / CANCEL lines. Monitoring a host is ONE remote
  command per tick, whatever the number of runs: check the PIDs of running
  wrappers (``kill -0``), then ``tail`` the file from the byte offset read
  last time. ``calls`` and ``tick_commands`` count those commands.
* **A launch guard per run**, taken with ``O_EXCL`` by the one command that
  starts (or cancels) it. A command repeated after a dropped connection, a
  restart, or a kill racing a launch can never start a run twice.
* **Runs outlive the connection**: ``setsid sh wrapper.sh RUNFILE`` with
  stdio away from the channel; the wrapper's PID is its process group, so
  ``kill`` signals the group (TERM, then KILL after ``kill_grace``).
* **Adoption after a restart**: a run this process has not heard of is
  looked up in the host's events file (read from byte 0 on the first tick)
  and, if silent there, by its guard and run file, in the same one command.
* **Runs stay ours until they end**: a run holds its slot (and its place in
  the launch queue) until it ends, is killed, or the core ``forget``s it. A
  status query that does not mention a run is no reason to let it go: the
  core does not hold runs whose submission has not returned (another host of
  the same ``submit_bulk`` may still be answering). The tick checks such runs
  in the same one command, so one that dies silently still frees its slot.
* **Nothing is guessed**: when a connection drops *during* a start command,
  the runs are reported submitted and the next tick asks the host where
  each one stands (prepared: launch it; started: watch it; absent: lost).
* **Lookup after a crash** (``lookup``): runs the core was submitting when it
  died are asked for by key, one command per host; a run on no host is
  fenced on each before the answer says so, so the submission that was under
  way can never start it once the core sends it again (``lookup.py``).

Submission is natively bulk: runs are spread over the hosts by free slots
(``slots`` per host, the rest queued here and started as slots free up,
by one command per host), the master's shared inputs are staged once per
host with SFTP, and one remote command per host prepares every run (run
directories, run files rendered with remote paths, input links) and starts
those that fit. When a run ends its output dir is fetched back with SFTP
*before* the run is reported final, because the core reads ``orch.log``
from the local output dir to judge it.

Checkpointing (the core's hook for remote drivers): a run's starting state
(``RunSpec.workdir/.orch-state``) goes to the host with its inputs; the
states it saved come back with its output, before it is reported ended;
``fetch_states`` copies running runs' new states once a tick (one small
read per run unless its ``current`` changed). ``free_slots(settings)``
says how many runs the hosts could start now.

An unreachable host is a backend fault, never the job's: ``submit``
places runs on the hosts that answer (``SubmitError`` when none does);
``status_bulk`` raises when no host answers (the core backs off and counts
``lost_after_seconds``), and when only some do, reports the others and
counts silence per host itself. Connections come back by themselves, with
backoff. Host keys are checked against ``known_hosts`` (by default
``~/.ssh/known_hosts``); only ``known_hosts=None`` turns that off, loudly.

``[backends.ssh]`` in the configuration may set ``connect_timeout`` (10),
``command_timeout`` (60), ``status_timeout`` (20), ``keepalive_interval`` (15), ``max_sessions``
(8 channels per connection), ``kill_grace`` (2), ``launch_grace`` (30),
``lost_after_seconds`` (600, for a host silent while others answer) and
``fetch_concurrency`` (16). Written against the public driver API only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.plugin import Capabilities

from .kill import KillMixin
from .lookup import LookupMixin
from .monitor import BackendFault, MonitorMixin
from .settings import validate
from .submit import SubmitMixin

__all__ = ["BackendFault", "SshDriver"]


class SshDriver(SubmitMixin, MonitorMixin, KillMixin, LookupMixin):
    """The ``ssh`` backend: its parts are the mixins (submit/launch, monitoring, kill, lookup) over
    ``placement.SshBase``."""

    name = "ssh"
    capabilities = Capabilities(bulk_submit=True, bulk_kill=True, bulk_status=True, runs_wrapper=True,
                                remote_states=True, lookup=True)

    @classmethod
    def validate_settings(cls, settings: Mapping[str, Any]) -> dict[str, Any]:
        return validate(settings)

    # ------------------------------------------------------------------ close
    async def aclose(self) -> None:
        for host in self.hosts.values():
            await host.aclose()
