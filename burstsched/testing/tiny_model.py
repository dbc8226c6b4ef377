"""The tiny random-weight model, built by the vLLM venv's python into a cache folder."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from pathlib import Path

from burstsched.testing.vllm_env import cache_root, venv_python

BUILDER = Path(__file__).with_name("tiny_model_build.py")
STAMP_NAME = ".burstsched-built"


def builder_digest() -> str:
    """Short digest of the builder's source: a changed builder means a rebuilt model."""
    return hashlib.sha256(BUILDER.read_bytes()).hexdigest()[:16]


def model_dir() -> Path:
    return cache_root() / "models" / f"tiny-qwen2-{builder_digest()}"


def model_ready() -> bool:
    try:
        return (model_dir() / STAMP_NAME).read_text() == builder_digest() + "\n"
    except OSError:
        return False


def ensure_model(*, python: Path | None = None, timeout_s: float = 600.0) -> Path:
    """Build the model (seconds) unless it is already there; returns its folder (tokenizer included)."""
    target = model_dir()
    if model_ready():
        return target
    interpreter = python if python is not None else venv_python()
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    started = time.monotonic()
    result = subprocess.run(
        [str(interpreter), str(BUILDER), str(staging)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-4000:]
        raise RuntimeError(f"building the tiny model failed (exit {result.returncode}):\n{tail}")
    (staging / STAMP_NAME).write_text(builder_digest() + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    for stale in target.parent.glob("tiny-qwen2-*"):
        if stale != target:
            shutil.rmtree(stale, ignore_errors=True)
    print(f"tiny model ready in {time.monotonic() - started:.1f} s: {target}", flush=True)
    return target
