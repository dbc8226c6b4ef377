"""The picker's TLS: a certificate given as files, or one made at start, as gateways expect by default.

Gateways talk to an endpoint picker over TLS without verifying its certificate unless told to (llm-d's
picker, like the Gateway API Inference Extension's reference, serves a self-signed certificate made at start
when none is mounted). :func:`self_signed` makes one in memory: an ECDSA P-256 key and a certificate for
``localhost``, ``127.0.0.1`` and the given host names, valid for a year; nothing is written to disk.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True, slots=True)
class Tls:
    """The server's certificate chain and private key, PEM-encoded."""

    cert: bytes
    key: bytes
    generated: bool = False

    @classmethod
    def from_files(cls, cert: Path, key: Path) -> Tls:
        return cls(cert.read_bytes(), key.read_bytes())


def self_signed(hosts: Sequence[str] = (), *, days: int = 365) -> Tls:
    """A fresh self-signed certificate for ``localhost``, ``127.0.0.1``, this machine's name and ``hosts``."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    seen: set[str] = set()
    for host in ("localhost", "127.0.0.1", socket.gethostname(), *hosts):
        if not host or host in seen or host in ("0.0.0.0", "::"):
            continue
        seen.add(host)
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "burstsched-epp")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return Tls(
        certificate.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        generated=True,
    )
