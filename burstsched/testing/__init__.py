"""Test support shipped with burstsched: real vLLM (CPU build) replicas and the tiny model they serve.

The simulator lives in `burstsched.sim`; this package brings up the real thing for contract and fidelity
checks. Fixtures for pytest are in `burstsched.testing.fixtures`; the replicas the router's tests run
against (simulated ones that record what they receive, and a fake for what no vLLM does) are in
`burstsched.testing.replicas`.
"""

from burstsched.testing.ports import free_port, free_ports
from burstsched.testing.real_vllm import real_vllm_pool
from burstsched.testing.tiny_model import ensure_model, model_dir, model_ready
from burstsched.testing.vllm_env import cache_root, ensure_venv, venv_dir, venv_python, venv_ready
from burstsched.testing.vllm_replica import (
    VllmConfig,
    VllmEnvMissing,
    VllmPool,
    VllmReplica,
    VllmStartError,
    stop_process,
)

__all__ = [
    "VllmConfig",
    "VllmEnvMissing",
    "VllmPool",
    "VllmReplica",
    "VllmStartError",
    "cache_root",
    "ensure_model",
    "ensure_venv",
    "free_port",
    "free_ports",
    "model_dir",
    "model_ready",
    "real_vllm_pool",
    "stop_process",
    "venv_dir",
    "venv_python",
    "venv_ready",
]
