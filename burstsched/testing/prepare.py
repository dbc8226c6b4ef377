"""`make real-vllm`: create the vLLM venv, build the tiny model (`python -m burstsched.testing.prepare`)."""

from __future__ import annotations

import sys
import time

from burstsched.testing.tiny_model import ensure_model
from burstsched.testing.vllm_env import ensure_venv, venv_dir


def main() -> int:
    started = time.monotonic()
    python = ensure_venv()
    model = ensure_model(python=python)
    print(f"vLLM venv: {venv_dir()}")
    print(f"tiny model: {model}")
    print(f"real-vLLM environment ready ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
