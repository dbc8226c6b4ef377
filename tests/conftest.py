"""Shared test configuration: anyio runs async tests on asyncio; hypothesis is derandomized in CI; a
self-signed certificate for TLS tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import settings

# Locally each run explores new examples; CI (CI=true) replays a fixed set, so a run's verdict does not
# depend on which examples hypothesis happened to draw.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key, made by ``openssl``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl to make a self-signed certificate with (the cryptography package is absent)")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key
