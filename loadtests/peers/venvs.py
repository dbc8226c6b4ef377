"""Each peer router in its own cached virtual environment, pinned, built once and reused.

The venv lives in ``<cache>/peers/<name>-<version>/`` (``<cache>`` as :func:`burstsched.testing.cache_root`
resolves it); a stamp file written last marks it complete, so an interrupted build is redone, never
half-used. Versions are pinned here (looked up with ``pip index versions``); bump them on purpose.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from burstsched.testing.vllm_env import cache_root

STAMP_NAME = ".burstsched-ready"


class PeerVenvError(RuntimeError):
    """A peer's venv could not be built; the message says which step failed and how."""


@dataclass(frozen=True, slots=True)
class PeerPackage:
    """A pip package that provides a peer router, at a pinned version."""

    name: str
    version: str
    import_check: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


SGLANG_ROUTER = PeerPackage("sglang-router", "0.3.2", "import sglang_router")
VLLM_ROUTER = PeerPackage("vllm-router", "0.1.17", "import vllm_router")


def peers_root() -> Path:
    return cache_root() / "peers"


def venv_dir(package: PeerPackage) -> Path:
    return peers_root() / f"{package.name}-{package.version}"


def venv_bin(package: PeerPackage) -> Path:
    return venv_dir(package) / "bin"


def venv_ready(package: PeerPackage) -> bool:
    """True when the venv was completed for this exact pin."""
    try:
        return (venv_dir(package) / STAMP_NAME).read_text() == package.requirement + "\n"
    except OSError:
        return False


def _run(args: list[str], timeout_s: float) -> None:
    print("+", " ".join(args), file=sys.stderr, flush=True)
    try:
        subprocess.run(args, check=True, timeout=timeout_s, capture_output=True)
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or b"").decode(errors="replace")[-2000:]
        raise PeerVenvError(f"{' '.join(args[:4])}… exited with {exc.returncode}:\n{tail}") from exc
    except subprocess.TimeoutExpired as exc:
        raise PeerVenvError(f"{' '.join(args[:4])}… took more than {timeout_s:.0f} s") from exc


def ensure_venv(package: PeerPackage, *, timeout_s: float = 900.0) -> Path:
    """Build (or reuse) the package's venv; returns its ``bin`` folder. Raises :class:`PeerVenvError`."""
    if venv_ready(package):
        return venv_bin(package)
    target = venv_dir(package)
    try:
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PeerVenvError(f"cannot prepare {target}: {exc}") from exc
    started = time.monotonic()
    _run([sys.executable, "-m", "venv", str(target)], timeout_s)
    python = str(venv_bin(package) / "python")
    _run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], timeout_s)
    _run([python, "-m", "pip", "install", "--quiet", package.requirement], timeout_s)
    _run([python, "-c", package.import_check], timeout_s)
    try:
        (target / STAMP_NAME).write_text(package.requirement + "\n")
    except OSError as exc:
        raise PeerVenvError(f"cannot write {target / STAMP_NAME}: {exc}") from exc
    print(f"{package.requirement} ready in {time.monotonic() - started:.0f} s: {target}", file=sys.stderr)
    return venv_bin(package)
