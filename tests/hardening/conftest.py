"""Fixtures: the simulator always, real vLLM when its environment is prepared (`make real-vllm`)."""

from burstsched.testing.fixtures import (  # noqa: F401 (fixtures are found by name)
    backend,
    sim_tokenizer_dir,
    tiny_model_dir,
    vllm_pool,
    vllm_replica,
)
