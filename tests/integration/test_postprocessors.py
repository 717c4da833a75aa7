"""Postprocessors: mergers, checkers and a Notifier that mails a real SMTP server (aiosmtpd, on loopback)."""

from __future__ import annotations

import gzip
import socket
from collections.abc import Iterator, Sequence
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

import anyio
import pytest

from orchestrator import (
    ArgSplitter,
    Backend,
    CustomChecker,
    CustomMerger,
    Executable,
    FileChecker,
    Job,
    JobStatus,
    Notifier,
    Orchestrator,
    TextMerger,
)

aiosmtpd = pytest.importorskip("aiosmtpd.controller", reason="aiosmtpd (the test extra) is not installed")

pytestmark = pytest.mark.anyio

#: Subjob i prints "line i"; subjob 3 also prints ERROR.
SCRIPT = 'echo "line $1"; if [ "$1" = 3 ]; then echo "ERROR: bad calibration"; fi'


class Inbox:
    """An aiosmtpd handler that keeps every message it is given."""

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


def home_with_smtp(tmp_path: Path, port: int) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text(
        f'[postprocess]\nsmtp_host = "127.0.0.1"\nsmtp_port = {port}\nsmtp_sender = "orch@test.invalid"\n'
        'allowed_recipients = ["@example.org"]\n')
    return home


def scan(n: int = 6, **kw: Any) -> Job:
    return Job(name="calib", application=Executable("/bin/sh"),
               splitter=ArgSplitter([["-c", SCRIPT, "sh", str(i)] for i in range(n)]), backend="local", **kw)


async def wait_for_mail(inbox: Inbox, n: int = 1) -> None:
    with anyio.fail_after(10):
        while len(inbox.mails) < n:
            await anyio.sleep(0.05)


async def test_checker_fails_a_subjob_and_one_mail_tells_the_counts(tmp_path: Path,
                                                                    smtp: tuple[int, Inbox]) -> None:
    port, inbox = smtp
    async with Orchestrator(home=home_with_smtp(tmp_path, port)) as orch:
        j = await orch.jobs.add(scan(postprocessors=[FileChecker(files=["stdout"], patterns=[r"^ERROR"]),
                                                     Notifier(to="prod@example.org", on=("failed",))]))
        await j.submit()
        await j.wait(timeout=60)
        assert j.status == "failed"
        assert [s.status.value for s in j.subjobs] == ["completed"] * 3 + ["failed"] + ["completed"] * 2
        assert "FileChecker: stdout matches '^ERROR'" in (j.subjobs[3].info.reason or "")
        await wait_for_mail(inbox)
        await anyio.sleep(0.5)  # nothing more comes: one mail per master, never one per subjob
    assert len(inbox.mails) == 1
    rcpt, mail = inbox.mails[0]
    assert rcpt == ["prod@example.org"] and mail["From"] == "orch@test.invalid"
    assert mail["Subject"] == f"orchestrator: job {j.fqid} (calib) failed: 5 completed, 1 failed"
    payload = mail.get_payload(decode=True)
    assert isinstance(payload, bytes)
    body = payload.decode()
    assert "completed  5" in body and "failed     1" in body
    assert f"{j.fqid}.3: FileChecker: stdout matches '^ERROR'" in body


async def test_no_mail_for_an_ending_not_asked_and_held_told_at_once(tmp_path: Path,
                                                                     smtp: tuple[int, Inbox]) -> None:
    port, inbox = smtp
    async with Orchestrator(home=home_with_smtp(tmp_path, port)) as orch:
        quiet = await orch.jobs.add(scan(3, postprocessors=[Notifier(to="a@example.org", on=["failed"])]))
        await quiet.submit()
        await quiet.wait(timeout=60)
        assert quiet.status == "completed"
        held = await orch.jobs.add(Job(name="hold", application=Executable("/bin/true"),
                                       splitter=ArgSplitter([["0"], ["1"]]),
                                       backend=Backend("sim", run_seconds=0.05, outcome={1: "held"}),
                                       postprocessors=[Notifier(to="b@example.org", on=["held"])]))
        await held.submit()
        await held.wait(timeout=30)
        assert held.status == "held"
        await wait_for_mail(inbox)
        await anyio.sleep(0.5)
    assert [rcpt for rcpt, _ in inbox.mails] == [["b@example.org"]]
    assert inbox.mails[0][1]["Subject"] == f"orchestrator: job {held.fqid} (hold) held: 1 completed, 1 held"


async def test_text_merger_compresses(tmp_path: Path) -> None:
    async with Orchestrator(home=tmp_path / "home") as orch:
        j = await orch.jobs.add(scan(4, postprocessors=[TextMerger(files=["stdout"], compress=True)]))
        await j.submit()
        await j.wait(timeout=60)
        assert j.status == "completed"
        merged = gzip.decompress((j.outputdir / "stdout.gz").read_bytes()).decode()
    assert merged == "line 0\nline 1\nline 2\nline 3\nERROR: bad calibration\n"


def count_lines(outputdir: Path, subjobs: Sequence[tuple[int, JobStatus, Path]]) -> str | None:
    """A user's merger: the number of stdout lines of each subjob, one per line."""
    (outputdir / "lines.txt").write_text("".join(f"{i} {len((d / 'stdout').read_text().splitlines())}\n"
                                                 for i, _, d in subjobs))
    return None


def no_error(outputdir: Path) -> bool | str:
    """A user's checker."""
    return "ERROR" not in (outputdir / "stdout").read_text() or "an ERROR line"


async def test_custom_merger_and_checker_survive_reopen(tmp_path: Path) -> None:
    home = tmp_path / "home"
    async with Orchestrator(home=home) as orch:
        j = await orch.jobs.add(scan(5, postprocessors=[CustomChecker(no_error), CustomMerger(count_lines)]))
    async with Orchestrator(home=home) as orch:  # stored by name, rebuilt on reopen
        j = orch.jobs[0]
        assert [type(p).__name__ for p in j.postprocessors] == ["CustomChecker", "CustomMerger"]
        await j.submit()
        await j.wait(timeout=60)
        assert j.subjobs[3].status == "failed" and "CustomChecker: an ERROR line" in (j.subjobs[3].info.reason or "")
        assert (j.outputdir / "lines.txt").read_text() == "0 1\n1 1\n2 1\n3 2\n4 1\n"


def raises_key_error(outputdir: Path) -> bool:
    """A user's checker with a bug."""
    return {"a": True}[outputdir.name]


async def test_a_checker_that_raises_whatever_fails_its_master_saying_so(tmp_path: Path) -> None:
    """A user's checker is the user's code: a ``KeyError`` from it went past the runtime's handler (which took
    four kinds of error), and the master never ended. Whatever it raises now fails the master, named."""
    async with Orchestrator(home=tmp_path / "home") as orch:
        j = await orch.jobs.add(scan(2, postprocessors=[CustomChecker(raises_key_error)]))
        await j.submit()
        await j.wait(timeout=60)
        assert j.status == "failed"
        assert "CustomChecker: KeyError" in (j.info.reason or ""), j.info.reason


def test_bad_postprocessor_parameters_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="on="):
        Notifier(on=["sometimes"])
    with pytest.raises(ValueError, match="not one mail address"):
        Notifier(to="nobody")
    with pytest.raises(ValueError, match="not a regular expression"):
        FileChecker(patterns=["("])
    with pytest.raises(ValueError, match="cannot be stored"):
        CustomChecker(lambda d: True)


# --------------------------------------------------------------------------- STARTTLS and a login
def self_signed(where: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, signed by its own key: ``(cert.pem, key.pem)``."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "orchestrator test SMTP")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = where / "cert.pem", where / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


class Logins:
    """aiosmtpd's authenticator: the one user and password it accepts, and every attempt made."""

    def __init__(self, user: str, password: str) -> None:
        self.user, self.password = user.encode(), password.encode()
        self.tried: list[tuple[str, bool]] = []

    def __call__(self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> Any:
        from aiosmtpd.smtp import AuthResult, LoginPassword

        ok = isinstance(data, LoginPassword) and (data.login, data.password) == (self.user, self.password)
        self.tried.append((mechanism, ok and bool(session.ssl)))
        return AuthResult(success=ok)


@pytest.fixture
def tls_smtp(tmp_path: Path) -> Iterator[tuple[int, Inbox, Logins, Path]]:
    """aiosmtpd on loopback that requires STARTTLS (a self-signed certificate) and a login before any mail."""
    import ssl

    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inbox, logins = Inbox(), Logins("prod", "s3cret pass")
    controller = aiosmtpd.Controller(inbox, hostname="127.0.0.1", port=port, tls_context=context,
                                     require_starttls=True, auth_required=True, auth_require_tls=True,
                                     authenticator=logins)
    controller.start()
    try:
        yield port, inbox, logins, cert
    finally:
        controller.stop()


async def test_notifier_over_starttls_with_a_login_trusting_the_sites_ca(
        tmp_path: Path, tls_smtp: tuple[int, Inbox, Logins, Path]) -> None:
    port, inbox, logins, cert = tls_smtp
    password = tmp_path / "smtp-password"
    password.write_text("s3cret pass\n")
    settings = (f'[postprocess]\nsmtp_host = "127.0.0.1"\nsmtp_port = {port}\nsmtp_sender = "orch@test.invalid"\n'
                f'smtp_starttls = true\nsmtp_user = "prod"\nsmtp_password_file = "{password}"\n'
                'allowed_recipients = ["ops@example.org"]\n')
    job = Job(name="tls", application=Executable("/bin/true"), splitter=ArgSplitter([["0"], ["1"]]),
              backend=Backend("sim", run_seconds=0.02), postprocessors=[Notifier(to="ops@example.org")])

    # The system's CAs do not know the server's certificate: verified, refused, nothing sent (the job completes).
    untrusting, trusting = tmp_path / "untrusting", tmp_path / "trusting"
    for home in (untrusting, trusting):
        home.mkdir()
    (untrusting / "orchestrator.toml").write_text(settings)
    async with Orchestrator(home=untrusting) as orch:
        j = await orch.jobs.add(job.template())
        await j.submit()
        await j.wait(timeout=30)
        assert j.status == "completed"
        await anyio.sleep(0.5)
    assert inbox.mails == [] and logins.tried == []

    (trusting / "orchestrator.toml").write_text(settings + f'smtp_ca_file = "{cert}"\n')
    async with Orchestrator(home=trusting) as orch:
        j = await orch.jobs.add(job.template())
        await j.submit()
        await j.wait(timeout=30)
        await wait_for_mail(inbox)
    assert logins.tried == [("PLAIN", True)]  # one login, over TLS, accepted
    [(rcpt, mail)] = inbox.mails
    assert rcpt == ["ops@example.org"] and mail["Subject"] == f"orchestrator: job {j.fqid} (tls) completed: 2 completed"
