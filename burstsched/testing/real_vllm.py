"""A one-call way to run workloads against real vLLM replicas."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from burstsched.testing.vllm_replica import VllmConfig, VllmPool


@asynccontextmanager
async def real_vllm_pool(replicas: int = 1, config: VllmConfig | None = None) -> AsyncIterator[VllmPool]:
    """Start `replicas` real vLLM replicas (one core each) and stop them on exit.

    The pool offers `urls`, `names`, `endpoints` ((name, url) pairs) and `model` (the served model name).
    """
    async with VllmPool(replicas, config) as pool:
        yield pool
