"""pytest fixtures for contract tests on the simulator and real vLLM; import them into a conftest.py.

The real replica starts once per session (about 35 s) and is shared; every fixture that needs it skips
with a visible reason when the vLLM environment is absent (`make real-vllm` prepares it). `backend` runs
a test once on the simulator and once on real vLLM (that case is marked `real_vllm`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from burstsched.testing.backends import Backend, sim_backend, vllm_backend, vllm_config
from burstsched.testing.tiny_model import ensure_model
from burstsched.testing.vllm_env import venv_dir, venv_ready
from burstsched.testing.vllm_replica import VllmPool, VllmReplica

REAL_VLLM_TIMEOUT_S = 300  # the first real-vLLM test also pays for the replica's start (31-37 s, up to 180)


def skip_reason() -> str | None:
    """Why real-vLLM tests cannot run here, or None when they can."""
    if venv_ready():
        return None
    return f"real vLLM environment absent ({venv_dir()}): run `make real-vllm` to prepare it"


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny model's folder (its tokenizer is in it); skips when the vLLM environment is absent."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    return ensure_model()


@pytest.fixture(scope="session")
def sim_tokenizer_dir() -> Path | None:
    """The tiny model's tokenizer for the simulator when the vLLM environment exists, else None."""
    return ensure_model() if skip_reason() is None else None


@pytest.fixture(scope="session")
def vllm_pool(tiny_model_dir: Path) -> Iterator[VllmPool]:
    """One real vLLM replica (80 blocks of 128, KV events on), shared by the whole session."""
    with VllmPool(1, vllm_config(tiny_model_dir)) as pool:
        yield pool


@pytest.fixture(scope="session")
def vllm_replica(vllm_pool: VllmPool) -> VllmReplica:
    """The session's real vLLM replica."""
    return vllm_pool.replicas[0]


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("sim", id="sim"),
        pytest.param(
            "vllm", id="vllm", marks=[pytest.mark.real_vllm, pytest.mark.timeout(REAL_VLLM_TIMEOUT_S)]
        ),
    ],
)
def backend(request: pytest.FixtureRequest, sim_tokenizer_dir: Path | None) -> Iterator[Backend]:
    """The replica a contract test talks to: a simulator configured like the real one, or real vLLM."""
    if request.param == "vllm":
        yield vllm_backend(request.getfixturevalue("vllm_pool"))
        return
    with sim_backend(sim_tokenizer_dir) as sim:
        yield sim
