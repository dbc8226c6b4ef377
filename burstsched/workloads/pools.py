"""Replica pools the workloads run against: simulated (in process) or real vLLM (child processes)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Literal

import httpx

from burstsched.workloads.seed import Replica

Backend = Literal["sim", "vllm"]


@dataclass(frozen=True, slots=True)
class PoolHandle:
    """What a workload needs to know of a running pool."""

    replicas: Sequence[Replica]
    model: str

    @property
    def endpoints(self) -> list[tuple[str, str]]:
        return [(r.name, r.url) for r in self.replicas]

    async def reset_prefix_caches(self, client: httpx.AsyncClient) -> None:
        for replica in self.replicas:
            response = await client.post(f"{replica.url}/reset_prefix_cache")
            response.raise_for_status()


@asynccontextmanager
async def open_pool(backend: Backend, replicas: int, *, time_scale: float = 1.0) -> AsyncIterator[PoolHandle]:
    """Start ``replicas`` replicas of the chosen backend and stop them on exit."""
    if backend == "sim":
        from burstsched.sim import SimConfig, SimPool

        config = SimConfig(time_scale=time_scale)
        async with SimPool(replicas, config) as pool:
            yield PoolHandle(
                replicas=[Replica(n, u) for n, u in zip(pool.names, pool.urls, strict=True)],
                model=config.served_model_name,
            )
        return
    from burstsched.testing.real_vllm import real_vllm_pool

    async with real_vllm_pool(replicas) as vllm:
        yield PoolHandle(replicas=[Replica(n, u) for n, u in vllm.endpoints], model=vllm.model)
