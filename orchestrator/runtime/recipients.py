"""Who a job's notifications may mail: its owner, unless an administrator allows more.

A ``Notifier`` sends through the orchestrator's SMTP server and login (the
service's, on a team's home), so ``to=`` must not reach anyone a user
names. The rule, from ``[postprocess]``:

- a job's owner may always be mailed, at their own address: the one
  ``mail_addresses`` maps them to (``{alice = "alice.smith@example.org"}``),
  else ``<owner>@<mail_domain>`` (this host's name when ``mail_domain`` is
  empty). A Notifier without ``to`` mails exactly that address.
- any other address must match ``allowed_recipients``, a list an
  administrator writes in the home's settings: whole addresses
  (``"ops@example.org"``) or domains (``"@example.org"``), compared without
  regard to case.

``add()`` refuses a job that names another address (``JobError``, field
``postprocessors[i].to``), and a notification checks again before it sends
(a job stored before the rule, or settings changed since).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.errors import ConfigError, JobError


def owner_address(owner: str, settings: Mapping[str, Any]) -> str:
    """The address of ``owner``: ``mail_addresses[owner]``, else ``owner@mail_domain`` (else this host)."""
    mapped = dict(settings.get("mail_addresses") or {}).get(owner)
    if mapped:
        return str(mapped)
    return f"{owner}@{settings.get('mail_domain') or socket.getfqdn()}"


def allowed(address: str, owner: str, settings: Mapping[str, Any]) -> bool:
    """Whether a notification of ``owner``'s job may mail ``address``."""
    wanted = address.strip().lower()
    if wanted == owner_address(owner, settings).lower():
        return True
    for entry in settings.get("allowed_recipients") or ():
        rule = str(entry).strip().lower()
        if wanted == rule or (rule.startswith("@") and wanted.endswith(rule)):
            return True
    return False


def refused(addresses: Sequence[str], owner: str, settings: Mapping[str, Any]) -> list[str]:
    """Those of ``addresses`` that ``owner``'s notifications may not mail."""
    return [a for a in addresses if not allowed(a, owner, settings)]


def check_spec(spec: Mapping[str, Any], owner: str, settings: Mapping[str, Any], fqid: str) -> None:
    """Refuse a job definition whose notifications name an address its owner may not mail (``JobError`` naming
    ``postprocessors[i].to``); nothing is stored."""
    chosen: list[tuple[str, Any]] = [(f"postprocessors[{i}]", p) for i, p in enumerate(spec.get("postprocessors")
                                                                                          or ())]
    if spec.get("merger"):
        chosen.append(("merger", spec["merger"]))
    for field, stored in chosen:
        params = stored.get("params") if isinstance(stored, Mapping) else None
        to = params.get("to") if isinstance(params, Mapping) else None
        if not to:
            continue
        addresses = [to] if isinstance(to, str) else [str(a) for a in to]
        bad = refused(addresses, owner, settings)
        if bad:
            own = owner_address(owner, settings)
            raise JobError(f"{', '.join(bad)}: a notification of {owner}'s job may mail {own} only, and the "
                           f"addresses [postprocess] allowed_recipients lists (an administrator's setting)",
                           fqid=fqid, field=f"{field}.to")


def check_settings(section: Mapping[str, Any], where: str) -> None:
    """``[postprocess]``'s recipients and SMTP login, checked when the settings are loaded."""
    rules = section.get("allowed_recipients", [])
    if not isinstance(rules, list) or not all(isinstance(r, str) and "@" in r and r.strip() == r and
                                              not any(c in r for c in " \r\n,;<>") for r in rules):
        raise ConfigError(f"{where}: postprocess.allowed_recipients must be a list of addresses "
                          f"(\"ops@example.org\") or domains (\"@example.org\"), not {rules!r}")
    mapped = section.get("mail_addresses", {})
    if not isinstance(mapped, dict) or not all(isinstance(k, str) and isinstance(v, str) and "@" in v
                                               for k, v in mapped.items()):
        raise ConfigError(f"{where}: postprocess.mail_addresses must map user names to addresses "
                          f"(alice = \"alice@example.org\"), not {mapped!r}")
    if section.get("smtp_user") and not section.get("smtp_starttls"):
        raise ConfigError(f"{where}: postprocess.smtp_user is set but smtp_starttls is false: the SMTP login "
                          f"would cross the network in clear; set smtp_starttls = true (the server's certificate "
                          f"is verified), or remove the login")

