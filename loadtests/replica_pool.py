"""The replica pool a workload load test runs on: simulated or real vLLM, sized, with its tokenizer.

Shared by the workload scripts (``loadtests/docqa.py``, ``loadtests/tenants.py``): the pool's command-line
options, a one-replica simulator with the serving tokenizer to size prompts before the pool starts, the
pool itself (its endpoints, model and the extra ``burstsched serve`` arguments it needs) and the KV-cache
size that makes all caches together hold a given fraction of a run's working set.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx

from burstsched.workloads.docqa import Tokenize
from burstsched.workloads.placement import Received, simulator_received
from burstsched.workloads.pools import event_args
from burstsched.workloads.targets import Endpoints

VLLM_BLOCK_SIZE = 128
Messages = Sequence[Mapping[str, str]]
TokenizeMessages = Callable[[Messages], Awaitable[list[int]]]
"""Token ids of a chat conversation as the engine renders it (chat template with the generation prompt)."""


def add_pool_arguments(parser: argparse.ArgumentParser) -> None:
    """``--backend``, ``--replicas`` and the KV-cache and simulator options :func:`open_pool` reads."""
    parser.add_argument("--backend", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--kv-blocks", type=int, default=None, help="KV blocks per replica")
    parser.add_argument("--cache-fraction", type=float, default=0.5)
    parser.add_argument("--block-size", type=int, default=16, help="simulator only (vLLM on CPU: 128)")
    parser.add_argument("--time-scale", type=float, default=0.1, help="simulator only")
    parser.add_argument(
        "--scheduling-policy",
        choices=("fcfs", "priority"),
        default="fcfs",
        help="the replicas' --scheduling-policy (priority: they serve lower `priority` values first, e.g. "
        "with burstsched's flow_control.engine_priority)",
    )
    parser.add_argument(
        "--replica-cpu-quota",
        type=float,
        default=None,
        metavar="CORES",
        help="real vLLM only: cap each replica at CORES CPUs (a cgroup quota, root only), so the router "
        "and the load generator get the rest of the cores whatever the routing",
    )


def replicas_setup(args: argparse.Namespace) -> str:
    """The report's line on the replicas: how many, their CPU cap if any, their scheduling policy if not
    FCFS."""
    quota = getattr(args, "replica_cpu_quota", None)
    line = str(args.replicas)
    if quota is not None and args.backend == "vllm":
        line += f", each capped at {quota:g} CPU (a cgroup quota over all its processes)"
    policy = getattr(args, "scheduling_policy", "fcfs")
    if policy != "fcfs":
        line += f", scheduling policy {policy}"
    return line


@dataclass(frozen=True, slots=True)
class Pool:
    endpoints: Endpoints
    model: str
    router_args: tuple[str, ...] = ()
    """burstsched's extra command line: the replicas' KV-event addresses and the tokenizer (precise mode)."""
    received: Received | None = None
    """The request ids each replica received so far (the simulator records them; real vLLM does not)."""


def tokenizer_dir(backend: str) -> Path | None:
    """The tokenizer the replicas use: the tiny model's for real vLLM, the built-in one (None) otherwise."""
    if backend != "vllm":
        return None
    from burstsched.testing import ensure_model

    return ensure_model()


@asynccontextmanager
async def sizing_replica(backend: str) -> AsyncIterator[Pool]:
    """A one-replica simulator with the serving tokenizer, to size prompts before the pool exists."""
    from burstsched.sim import SimConfig, SimPool

    folder = tokenizer_dir(backend)
    config = SimConfig(time_scale=0.0, tokenizer=None if folder is None else str(folder))
    async with SimPool(1, config) as pool:
        yield Pool([(pool.names[0], pool.urls[0])], config.served_model_name)


@asynccontextmanager
async def open_pool(args: argparse.Namespace, kv_blocks: int, max_model_len: int) -> AsyncIterator[Pool]:
    if args.backend == "sim":
        from burstsched.sim import SimConfig, SimPool

        config = SimConfig(
            time_scale=args.time_scale,
            block_size=args.block_size,
            num_gpu_blocks=kv_blocks,
            max_model_len=max_model_len,
            kv_events_endpoint="tcp://127.0.0.1:*",
            kv_events_replay_endpoint="tcp://127.0.0.1:*",
            scheduling_policy=args.scheduling_policy,
        )
        async with SimPool(args.replicas, config, record_requests=True) as pool:
            router_args = event_args(pool.names, pool.kv_events_endpoints, pool.kv_events_replay_endpoints)
            yield Pool(
                list(zip(pool.names, pool.urls, strict=True)),
                config.served_model_name,
                (*router_args, "--tokenizer", "remote"),
                received=partial(simulator_received, pool),
            )
        return
    from burstsched.testing import VllmConfig, ensure_model, real_vllm_pool

    vllm = VllmConfig(
        num_gpu_blocks_override=kv_blocks,
        max_model_len=max_model_len,
        prompt_tokens_details=True,
        kv_events=True,
        cpu_quota_cores=args.replica_cpu_quota,
        record_request_ids=True,
        extra_args=("--scheduling-policy", args.scheduling_policy),
    )
    async with real_vllm_pool(args.replicas, vllm) as pool:
        router_args = event_args(
            pool.names,
            [r.kv_events_endpoint for r in pool.replicas],
            [r.kv_replay_endpoint for r in pool.replicas],
        )
        paths = [r.request_ids_path for r in pool.replicas]
        yield Pool(
            pool.endpoints,
            pool.model,
            (*router_args, "--tokenizer", str(ensure_model())),
            received=partial(read_replica_ids, [p for p in paths if p is not None]),
        )


def read_replica_ids(paths: Sequence[Path]) -> list[list[str]]:
    """The ids each real replica's request-id file holds (``VllmConfig.record_request_ids``)."""
    from burstsched.testing.replica_hooks.burstsched_request_ids import read_ids

    return [read_ids(path) for path in paths]


def kv_blocks_for(args: argparse.Namespace, working_set_blocks: int, max_model_len: int, block: int) -> int:
    """``--kv-blocks``, or enough blocks per replica that all caches together hold ``--cache-fraction`` of
    the working set (never less than one longest request)."""
    if args.kv_blocks is not None:
        blocks: int = args.kv_blocks
        return blocks
    per_replica = math.ceil(float(args.cache_fraction) * working_set_blocks / int(args.replicas)) + 1
    return max(per_replica, math.ceil(max_model_len / block) + 1)


def messages_tokenizer_of(client: httpx.AsyncClient, url: str, model: str) -> TokenizeMessages:
    """Token ids of a conversation through a replica's ``/tokenize`` (chat template applied)."""

    async def tokenize(messages: Messages) -> list[int]:
        body = {"model": model, "messages": [dict(m) for m in messages]}
        response = await client.post(f"{url}/tokenize", json=body)
        response.raise_for_status()
        return [int(t) for t in response.json()["tokens"]]

    return tokenize


def tokenizer_of(client: httpx.AsyncClient, url: str, model: str) -> Tokenize:
    """Token ids of a text as one user message, through a replica's ``/tokenize`` (chat template applied)."""
    messages = messages_tokenizer_of(client, url, model)

    async def tokenize(text: str) -> list[int]:
        return await messages([{"role": "user", "content": text}])

    return tokenize
