"""Fixtures for the contract and fidelity tests: the simulator always, real vLLM when `make real-vllm` ran."""

from burstsched.testing.fixtures import (  # noqa: F401 (fixtures are found by name)
    backend,
    sim_tokenizer_dir,
    tiny_model_dir,
    vllm_pool,
    vllm_replica,
)
