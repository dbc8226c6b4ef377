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
    router_args: Sequence[str] = ()
    """Extra ``burstsched serve`` arguments the pool needs: each replica's KV-event addresses and the
    tokenizer, for configs with a precise prefix producer (others ignore them)."""

    @property
    def endpoints(self) -> list[tuple[str, str]]:
        return [(r.name, r.url) for r in self.replicas]

    async def reset_prefix_caches(self, client: httpx.AsyncClient) -> None:
        """Empty every replica's prefix cache, then run one one-token request on each.

        vLLM publishes a reset's ``AllBlocksCleared`` event with its next engine step, and an idle engine runs
        none: until a request arrives there, a router following the events (or replaying them when it
        starts) still believes the replica holds what it held before. The one-token request is that step.
        """
        for replica in self.replicas:
            response = await client.post(f"{replica.url}/reset_prefix_cache")
            response.raise_for_status()
        for replica in self.replicas:
            body = {"model": self.model, "prompt": "reset", "max_tokens": 1}
            response = await client.post(f"{replica.url}/v1/completions", json=body)
            response.raise_for_status()


def event_args(
    names: Sequence[str], events: Sequence[str | None], replays: Sequence[str | None]
) -> list[str]:
    """``burstsched serve`` arguments naming each replica's KV-event and replay addresses (None: none)."""
    args: list[str] = []
    for name, address, replay in zip(names, events, replays, strict=True):
        if address is not None:
            args += ["--kv-events", f"{name}={address}"]
        if replay is not None:
            args += ["--kv-events-replay", f"{name}={replay}"]
    return args


@asynccontextmanager
async def open_pool(
    backend: Backend,
    replicas: int,
    *,
    time_scale: float = 1.0,
    kv_events: bool = True,
    cpu_quota: float | None = None,
) -> AsyncIterator[PoolHandle]:
    """Start ``replicas`` replicas of the chosen backend and stop them on exit.

    With ``kv_events`` each replica publishes its KV-cache events and serves replays, and the handle's
    ``router_args`` tell a router where they are and how to tokenize (for the precise prefix producer): real
    vLLM's tiny model's tokenizer files, or the simulator's own ``/tokenize`` (its built-in tokenizer has no
    files). ``cpu_quota``: real vLLM only, each replica capped at that many CPUs (a cgroup; root only).
    """
    if backend == "sim":
        from burstsched.sim import SimConfig, SimPool

        events = "tcp://127.0.0.1:*" if kv_events else None
        config = SimConfig(time_scale=time_scale, kv_events_endpoint=events, kv_events_replay_endpoint=events)
        async with SimPool(replicas, config) as pool:
            args = event_args(pool.names, pool.kv_events_endpoints, pool.kv_events_replay_endpoints)
            if kv_events:
                args += ["--tokenizer", "remote"]
            yield PoolHandle(
                replicas=[Replica(n, u) for n, u in zip(pool.names, pool.urls, strict=True)],
                model=config.served_model_name,
                router_args=args,
            )
        return
    from burstsched.testing.real_vllm import real_vllm_pool
    from burstsched.testing.tiny_model import ensure_model
    from burstsched.testing.vllm_replica import VllmConfig

    async with real_vllm_pool(replicas, VllmConfig(kv_events=kv_events, cpu_quota_cores=cpu_quota)) as vllm:
        args = event_args(
            vllm.names,
            [r.kv_events_endpoint for r in vllm.replicas],
            [r.kv_replay_endpoint for r in vllm.replicas],
        )
        if kv_events:
            args += ["--tokenizer", str(ensure_model())]
        yield PoolHandle(
            replicas=[Replica(n, u) for n, u in vllm.endpoints], model=vllm.model, router_args=args
        )
