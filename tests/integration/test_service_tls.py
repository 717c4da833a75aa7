"""TCP beyond loopback: the service listens there only with TLS, and its clients verify it.

A CA and a server certificate for 127.0.0.1, 127.0.0.2 and localhost are made in the test (``cryptography``);
each service is a real ``orchestrator serve`` subprocess, stopped by its PID. The machine has no other
network: the service binds ``0.0.0.0`` or ``127.0.0.2`` and the clients connect through loopback.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import ssl
import subprocess
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from served import ORCH, Service, cli, start

from orchestrator import Backend, Executable, Job, Orchestrator
from orchestrator.api.client import ServiceUnavailable

x509 = pytest.importorskip("cryptography.x509", reason="cryptography is not installed")


def _key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def make_pki(where: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate it signed for the service: ``(ca.pem, cert.pem, key.pem)``, the key 0600."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key, key = _key(), _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "orchestrator test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    names = [x509.DNSName("localhost"), *(x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "127.0.0.2"))]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "orchestrator service")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    files = where / "ca.pem", where / "cert.pem", where / "key.pem"
    files[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    files[2].chmod(0o600)
    return files


def tls_home(tmp_path: Path, host: str) -> tuple[Path, Path]:
    """A home whose service listens on ``host`` with TLS; the CA's file."""
    ca, cert, key = make_pki(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    (home / "orchestrator.toml").write_text(f'[core]\npoll_interval = 0.05\n[service]\ntcp_host = "{host}"\n'
                                            f'tls_cert = "{cert}"\ntls_key = "{key}"\n')
    return home, ca


def sim_job() -> Job:
    return Job(name="far", application=Executable("/bin/true"), backend=Backend("sim", run_seconds=0.05))


def test_a_service_on_all_addresses_speaks_https_and_a_client_with_the_ca_works(
        services: list[Service], tmp_path: Path) -> None:
    home, ca = tls_home(tmp_path, "0.0.0.0")
    service = start(services, home, "--tcp-port", "0")
    assert service.info["tls"] is True and service.info["host"] == "0.0.0.0"
    url = f"https://127.0.0.1:{service.port}"
    assert service.info["url"] == url
    elsewhere = tmp_path / "client-home"  # a client on "another host": a home of its own, no socket

    async def main() -> None:
        async with Orchestrator(home=elsewhere, url=url, token=service.token, ca=ca) as orch:
            assert orch.remote
            job = await orch.jobs.add(sim_job())
            await job.submit()
            await job.wait(timeout=30)
            assert job.status == "completed"
            assert [j.name for j in orch.jobs] == ["far"]

    anyio.run(main)
    # The command line, the same way: --url, --token-file, --ca.
    token_file = tmp_path / "token"
    token_file.write_text(service.token + "\n")
    listed = cli(elsewhere, "--url", url, "--token-file", str(token_file), "--ca", str(ca), "jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert '"name": "far"' in listed.stdout
    # Or from the environment, the CA from the client home's [service] tls_ca.
    elsewhere.mkdir()
    (elsewhere / "orchestrator.toml").write_text(f'[service]\ntls_cert = ""\ntls_ca = "{ca}"\n')
    env = {**os.environ, "ORCHESTRATOR_URL": url, "ORCHESTRATOR_TOKEN_FILE": str(token_file)}
    shown = subprocess.run([str(ORCH), "--home", str(elsewhere), "show", "0", "--json"], capture_output=True,
                           text=True, timeout=60, stdin=subprocess.DEVNULL, env=env)
    assert shown.returncode == 0 and '"status": "completed"' in shown.stdout, shown.stderr
    # Plain HTTP on that port gets nothing: the listener speaks TLS only.
    with pytest.raises(httpx.TransportError), httpx.Client(timeout=5) as plain:
        plain.get(f"http://127.0.0.1:{service.port}/health", headers={"authorization": f"Bearer {service.token}"})
    assert "Traceback" not in service.output()


def test_a_client_without_the_ca_is_refused_saying_why(services: list[Service], tmp_path: Path) -> None:
    home, _ca = tls_home(tmp_path, "0.0.0.0")
    service = start(services, home, "--tcp-port", "0")
    url = f"https://127.0.0.1:{service.port}"

    async def main() -> None:
        with pytest.raises(ServiceUnavailable, match="cannot be verified.*--ca FILE"):
            async with Orchestrator(home=tmp_path / "client-home", url=url, token=service.token):
                pass

    anyio.run(main)
    token_file = tmp_path / "token"
    token_file.write_text(service.token + "\n")
    refused = cli(tmp_path / "client-home", "--url", url, "--token-file", str(token_file), "jobs")
    assert refused.returncode == 2 and "cannot be verified" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    # The service goes on serving those that trust it; the refused handshakes are one line each in its log.
    with httpx.Client(verify=_context(_ca), timeout=10) as ok:
        answer = ok.get(f"{url}/health", headers={"authorization": f"Bearer {service.token}"})
        assert answer.status_code == 200
    assert "TLS handshake failed" in service.output() and "Traceback" not in service.output()


def _context(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def test_a_service_on_another_loopback_address_with_tls(services: list[Service], tmp_path: Path) -> None:
    home, ca = tls_home(tmp_path, "127.0.0.2")
    service = start(services, home, "--tcp-port", "0")
    url = f"https://127.0.0.2:{service.port}"
    assert service.info["url"] == url

    async def main() -> None:
        async with Orchestrator(home=tmp_path / "client-home", url=url, token=service.token, ca=ca) as orch:
            assert (await orch.jobs.add(sim_job())).owner

    anyio.run(main)
    with pytest.raises(httpx.TransportError), httpx.Client(timeout=5) as c:  # not on 127.0.0.1
        c.get(f"https://127.0.0.1:{service.port}/health")


@pytest.mark.parametrize("case", ["all-addresses", "a-name", "cert-without-key", "key-readable"])
def test_beyond_loopback_without_tls_the_service_refuses_to_start(case: str, tmp_path: Path) -> None:
    ca, cert, key = make_pki(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    settings = {"all-addresses": '[service]\ntcp_host = "0.0.0.0"\n',
                "a-name": '[service]\ntcp_host = "orchestrator.example.org"\n',
                "cert-without-key": f'[service]\ntcp_host = "0.0.0.0"\ntls_cert = "{cert}"\n',
                "key-readable": f'[service]\ntcp_host = "0.0.0.0"\ntls_cert = "{cert}"\ntls_key = "{key}"\n'}
    expected = {"all-addresses": "'0.0.0.0' is beyond loopback", "a-name": "is beyond loopback",
                "cert-without-key": "tls_cert and service.tls_key go together", "key-readable": "chmod 600"}
    if case == "key-readable":
        key.chmod(0o644)
    (home / "orchestrator.toml").write_text(settings[case])
    result = subprocess.run([str(ORCH), "--home", str(home), "serve", "--tcp-port", "0"], capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 2, result
    assert expected[case] in result.stderr and "Traceback" not in result.stderr, result.stderr
    if case == "all-addresses":
        assert "tls_cert and tls_key" in result.stderr
    assert not (home / "service" / "api.sock").exists() and not (home / "service" / "service.json").exists()
    # The same asked on the command line: refused the same way.
    if case == "all-addresses":
        (home / "orchestrator.toml").unlink()
        flag = subprocess.run([str(ORCH), "--home", str(home), "serve", "--tcp-port", "0", "--tcp-host", "0.0.0.0"],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert flag.returncode == 2 and "beyond loopback" in flag.stderr and "Traceback" not in flag.stderr
