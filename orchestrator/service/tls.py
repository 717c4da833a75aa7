"""TLS for the service's TCP listener: beyond loopback, the control API speaks HTTPS only.

``[service] tcp_host`` (default ``127.0.0.1``) says where the TCP listener
binds. A loopback address needs nothing more (only this machine's users
reach it, and each shows a token); any other address (``0.0.0.0``, a
host's name or address) is refused unless ``[service] tls_cert`` and
``tls_key`` name the PEM files of the service's certificate and key: the
tokens and every job would otherwise cross the network in clear. With
them, the listener is wrapped in anyio's TLS streams (the standard
library's ``ssl`` does the protocol) and h11 speaks HTTP on top as before.

Clients verify the certificate against ``[service] tls_ca``,
``$ORCHESTRATOR_CA`` or ``--ca`` (:mod:`orchestrator.api.client`).
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError
from ..plugin.logs import get_logger

log = get_logger(component="tls")

#: Seconds a client has to finish the TLS handshake before its connection is dropped.
HANDSHAKE_TIMEOUT = 10.0


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``127.0.0.0/8``, ``::1``) or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class TcpSettings:
    """Where the TCP listener binds, and the TLS context it speaks (``None``: plain HTTP, loopback only)."""

    host: str
    tls: ssl.SSLContext | None

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    def url(self, port: int) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else "::1" if self.host == "::" else self.host
        return f"{self.scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def tcp_settings(section: Mapping[str, Any], host: str | None = None) -> TcpSettings:
    """``[service] tcp_host``, ``tls_cert`` and ``tls_key``, checked: refused with the reason (``ConfigError``)."""
    host = host if host is not None else section.get("tcp_host", "127.0.0.1")
    if not isinstance(host, str) or not host.strip():
        raise ConfigError(f"service.tcp_host must be a host name or an address, not {host!r}")
    cert, key = (str(section.get(k) or "") for k in ("tls_cert", "tls_key"))
    if bool(cert) != bool(key):
        raise ConfigError("service.tls_cert and service.tls_key go together: give both PEM files, or neither")
    if not cert:
        if not is_loopback(host):
            raise ConfigError(f"service.tcp_host = {host!r} is beyond loopback: the service listens there only "
                              f"with TLS (set [service] tls_cert and tls_key to PEM files), or the tokens and "
                              f"every job would cross the network in clear")
        return TcpSettings(host, None)
    return TcpSettings(host, server_context(Path(cert).expanduser(), Path(key).expanduser()))


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The service's TLS context: its certificate chain and key (the key file must be the service's alone)."""
    for name, path in (("tls_cert", cert), ("tls_key", key)):
        if not path.is_file():
            raise ConfigError(f"service.{name}: {path} is not a file")
    if key.stat().st_mode & 0o077:
        raise ConfigError(f"service.tls_key: others may read {key}; chmod 600 it")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(os.fspath(cert), os.fspath(key))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"service.tls_cert / tls_key ({cert}, {key}): not a certificate and its key in PEM: "
                          f"{exc}") from None
    return context


