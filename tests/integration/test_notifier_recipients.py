"""Whom a Notifier may mail: the job's owner, and what ``[postprocess] allowed_recipients`` lists, nothing else
(the mail goes through the orchestrator's SMTP login); and never a login in clear. A real SMTP server (aiosmtpd,
on loopback) receives what is sent; the team's case runs through a real service (a subprocess, stopped by PID)."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
from collections.abc import Iterator
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

import anyio
import pytest
from served import ORCH, Service, cli_ok, start

from orchestrator import ArgSplitter, Backend, Executable, Job, JobError, Notifier, Orchestrator
from orchestrator.api.client import ServiceClient
from orchestrator.core.errors import ConfigError

aiosmtpd = pytest.importorskip("aiosmtpd.controller", reason="aiosmtpd (the test extra) is not installed")

ME = pwd.getpwuid(os.getuid()).pw_name


class Inbox:
    def __init__(self) -> None:
        self.mails: list[tuple[list[str], Message]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 (aiosmtpd's name)
        self.mails.append((list(envelope.rcpt_tos), message_from_bytes(envelope.content)))
        return "250 OK"


@pytest.fixture
def smtp() -> Iterator[tuple[int, Inbox]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inbox = Inbox()
    controller = aiosmtpd.Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port, inbox
    finally:
        controller.stop()


def sim_job(*notifiers: Notifier) -> Job:
    return Job(name="mailed", application=Executable("/bin/true"), splitter=ArgSplitter([["0"], ["1"]]),
               backend=Backend("sim", run_seconds=0.02), postprocessors=list(notifiers))


async def mails(inbox: Inbox, n: int) -> list[list[str]]:
    with anyio.fail_after(20):
        while len(inbox.mails) < n:
            await anyio.sleep(0.05)
    await anyio.sleep(0.3)  # nothing more comes
    return [rcpt for rcpt, _ in inbox.mails]


def home_with(tmp_path: Path, port: int, more: str = "") -> Path:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "orchestrator.toml").write_text(
        f'[core]\npoll_interval = 0.05\n[postprocess]\nsmtp_host = "127.0.0.1"\nsmtp_port = {port}\n'
        f'smtp_sender = "orch@test.invalid"\nmail_domain = "example.net"\n{more}')
    return home


def test_a_notifier_mails_its_owner_and_another_address_is_refused_at_add(tmp_path: Path,
                                                                          smtp: tuple[int, Inbox]) -> None:
    port, inbox = smtp
    home = home_with(tmp_path, port)

    async def main() -> None:
        async with Orchestrator(home=home) as orch:
            for to in ("boss@example.org", [f"{ME}@example.net", "x@example.net"], f"{ME}@example.net.evil.org"):
                with pytest.raises(JobError) as refused:
                    await orch.jobs.add(sim_job(Notifier(on=["failed"]), Notifier(to=to)))
                assert refused.value.field == "postprocessors[1].to", refused.value
                assert "allowed_recipients" in str(refused.value) and f"{ME}@example.net" in str(refused.value)
            assert len(orch.jobs) == 0  # nothing stored
            # The owner's own address, named or by default (the owner at mail_domain): sent.
            job = await orch.jobs.add(sim_job(Notifier(), Notifier(to=f"{ME.upper()}@Example.NET")))
            await job.submit()
            await job.wait(timeout=30)
            assert await mails(inbox, 2) == [[f"{ME}@example.net"], [f"{ME.upper()}@Example.NET"]]

    anyio.run(main)


def test_an_administrator_allows_addresses_and_domains_and_maps_users(tmp_path: Path,
                                                                      smtp: tuple[int, Inbox]) -> None:
    port, inbox = smtp
    home = home_with(tmp_path, port, 'allowed_recipients = ["ops@example.org", "@team.example"]\n'
                                     f'[postprocess.mail_addresses]\n{ME} = "me.myself@example.com"\n')

    async def main() -> None:
        async with Orchestrator(home=home) as orch:
            for to in ("boss@example.org", "x@team.example.com", f"{ME}@example.net"):
                with pytest.raises(JobError, match="allowed_recipients") as refused:
                    await orch.jobs.add(sim_job(Notifier(to=to)))
                assert refused.value.field == "postprocessors[0].to"
            job = await orch.jobs.add(sim_job(Notifier(to=["ops@example.org", "Anyone@TEAM.example"]), Notifier()))
            await job.submit()
            await job.wait(timeout=30)
            got = await mails(inbox, 2)
            assert sorted(map(sorted, got)) == [["Anyone@TEAM.example", "ops@example.org"],
                                                ["me.myself@example.com"]]

    anyio.run(main)


def test_a_listed_user_of_a_service_may_mail_only_themselves(services: list[Service], tmp_path: Path,
                                                              smtp: tuple[int, Inbox]) -> None:
    port, inbox = smtp
    try:  # a multi-user service admits OS users only (it runs their work as them)
        user = pwd.getpwnam("orch-alice").pw_name
    except KeyError:
        pytest.skip("no OS user orch-alice (scripts/install-test-deps.sh makes it)")
    home = home_with(tmp_path, port, f'[service]\nusers = ["{user}"]\n')
    service = start(services, home, "--tcp-port", "0")
    token = cli_ok(home, "token", user).strip()

    async def main() -> None:
        async with ServiceClient(url=service.url, token=token) as alice:
            for to in (f"{ME}@example.net", "bob@example.net", "ops@example.org"):
                with pytest.raises(JobError) as refused:
                    await alice.add(name="m", spec=sim_job(Notifier(to=to)).spec())
                assert refused.value.field == "postprocessors[0].to"
                assert f"{user}@example.net only" in str(refused.value)
            assert await alice.jobs() == []
            # Changing the definition at submission is checked the same way.
            added = await alice.add(name="m", spec=sim_job(Notifier(on=["completed"])).spec())
            sneaky = sim_job(Notifier(to="ceo@example.org", on=["completed"])).spec()
            with pytest.raises(JobError) as refused:
                await alice.submit(fqid=added["fqid"], definitions={added["fqid"]: {"name": "m", "spec": sneaky}})
            assert refused.value.field == "postprocessors[0].to"
            await alice.submit(fqid=added["fqid"])
            await alice.wait(fqid=added["fqid"], timeout=30)
            assert await mails(inbox, 1) == [[f"{user}@example.net"]]

    anyio.run(main)


def test_an_smtp_login_without_starttls_is_refused_when_the_settings_load(tmp_path: Path,
                                                                          smtp: tuple[int, Inbox]) -> None:
    port, inbox = smtp
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    password.chmod(0o600)
    home = home_with(tmp_path, port, f'smtp_user = "prod"\nsmtp_password_file = "{password}"\n')

    async def main() -> None:
        with pytest.raises(ConfigError, match="smtp_user is set but smtp_starttls is false"):
            async with Orchestrator(home=home):
                pass

    anyio.run(main)
    served = subprocess.run([str(ORCH), "--home", str(home), "serve"], capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert served.returncode == 2 and "in clear" in served.stderr and "Traceback" not in served.stderr
    assert "s3cret" not in served.stderr and inbox.mails == []
