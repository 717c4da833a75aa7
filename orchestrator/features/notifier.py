"""``Notifier``: one mail per master when it ends (DØ's notify-on-failure, Ganga's Notifier), over SMTP.

The mail names the job, its ending, its subjobs per status and the first
failure reasons. It goes to ``to``, by default the job owner's address
(``[postprocess] mail_addresses``, else the owner at ``mail_domain``, this
host's name when that is empty). ``to`` may name the owner's address and
those ``[postprocess] allowed_recipients`` lists, nothing else
(:mod:`orchestrator.runtime.recipients`): the mail goes through the
orchestrator's SMTP login, which a team's users must not turn on anyone. SMTP settings come from ``[postprocess]``:
``smtp_host``, ``smtp_port``, ``smtp_sender``, ``smtp_starttls``,
``smtp_user`` and ``smtp_password_file`` (a file holding the password, so
that it is never in a settings file), and ``smtp_ca_file``: the certificates
to trust for STARTTLS instead of the system's (a site's own CA). The server's
certificate and host name are always checked; there is no setting to turn
that off, and a login is never sent without STARTTLS (the settings that would
are refused when they are loaded). The standard library's ``smtplib`` speaks SMTP: nothing more is
needed for one mail per master.
"""

from __future__ import annotations

import getpass
import smtplib
import socket
import ssl
from collections.abc import Mapping, Sequence
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from ..core import statuses
from ..plugin.postprocess import Notification, Outcome, PostprocessContext
from ..runtime.recipients import owner_address, refused

#: What a master may end as, in the statuses' order: the statuses a mail may be asked for.
ENDINGS = tuple(s.value for s in statuses.ALL_STATUSES if s in statuses.ENDINGS)


class Notifier(Notification):
    """``Notifier(to="me@example.org", on=("failed", "held"))``: mail when the master ends in one of ``on``."""

    name = "notifier"

    def __init__(self, to: str | Sequence[str] | None = None, on: Sequence[str] = ("failed", "held", "completed"),
                 ) -> None:
        self.to = [to] if isinstance(to, str) else list(to or [])
        for address in self.to:
            if "@" not in address or any(c in address for c in "\r\n,;<>"):
                raise ValueError(f"Notifier: to={address!r} is not one mail address")
        chosen = [on] if isinstance(on, str) else list(on)
        unknown = [s for s in chosen if s not in ENDINGS]
        if unknown or not chosen:
            raise ValueError(f"Notifier: on={chosen!r}: each must be one of {', '.join(ENDINGS)}")
        self.on = tuple(chosen)

    def params(self) -> dict[str, Any]:
        return {"to": self.to, "on": list(self.on)}

    def recipients(self, config: Mapping[str, Any], owner: str | None = None) -> list[str]:
        return self.to or [owner_address(owner or getpass.getuser(), config)]

    def message(self, context: PostprocessContext, outcome: Outcome) -> EmailMessage:
        config = context.config
        mail = EmailMessage()
        counts = ", ".join(f"{n} {status}" for status, n in outcome.counts.items())
        label = f"job {context.fqid}" + (f" ({context.name})" if context.name else "")
        mail["Subject"] = f"orchestrator: {label} {outcome.status}: {counts}"
        mail["From"] = str(config.get("smtp_sender") or f"orchestrator@{socket.getfqdn()}")
        mail["To"] = ", ".join(self.recipients(config, context.owner))
        lines = [f"{label} {outcome.status} on {socket.gethostname()}.", "", "Subjobs per status:"]
        lines += [f"  {status:<10} {n}" for status, n in outcome.counts.items()]
        if outcome.error:
            lines += ["", f"Postprocessing failed it: {outcome.error}"]
        if outcome.failures:
            lines += ["", "First failures:"] + [f"  {fqid}: {reason}" for fqid, reason in outcome.failures]
        lines += ["", f"Output: {context.outputdir}", f"See: orchestrator show {context.fqid} --status failed"]
        mail.set_content("\n".join(lines) + "\n")
        return mail

    def send(self, context: PostprocessContext, outcome: Outcome) -> None:
        config = context.config
        owner = context.owner or getpass.getuser()
        bad = refused(self.recipients(config, owner), owner, config)
        if bad:  # a job stored before the rule, or settings changed since: checked again, nothing sent
            raise ValueError(f"{', '.join(bad)}: not {owner}'s address, nor in [postprocess] allowed_recipients")
        if config.get("smtp_user") and not config.get("smtp_starttls"):
            raise ValueError("an SMTP login needs smtp_starttls = true: it is never sent in clear")
        host, port = str(config.get("smtp_host") or "localhost"), int(config.get("smtp_port") or 25)
        with smtplib.SMTP(host, port, timeout=30) as smtp:
            if config.get("smtp_starttls"):
                cafile = str(Path(str(config["smtp_ca_file"])).expanduser()) if config.get("smtp_ca_file") else None
                smtp.starttls(context=ssl.create_default_context(cafile=cafile))
            if config.get("smtp_user"):
                password = Path(str(config.get("smtp_password_file") or "")).expanduser().read_text().strip()
                smtp.login(str(config["smtp_user"]), password)
            smtp.send_message(self.message(context, outcome))
