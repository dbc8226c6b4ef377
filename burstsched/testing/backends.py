"""One face for a replica under test, simulated or real, so contract tests run the same code on both."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx
import zmq
import zmq.asyncio
from prometheus_client.parser import text_string_to_metric_families

from burstsched.prefix.kv_events import KVEventMessage, decode_message
from burstsched.sim import SimConfig, SimPool
from burstsched.testing.vllm_replica import VllmConfig, VllmPool
from burstsched.wire.sse import DONE, aiter_data

Kind = Literal["sim", "vllm"]
SERVED_MODEL_NAME = "kv-demo"
BLOCK_SIZE = 128  # vLLM's CPU default
NUM_GPU_BLOCKS = 80  # small enough for eviction cases, big enough for 8192-token requests
MAX_MODEL_LEN = 8192
CPU_MAX_NUM_BATCHED_TOKENS = 2048  # vLLM's CPU API-server defaults
CPU_MAX_NUM_SEQS = 128


@dataclass(frozen=True, slots=True)
class Backend:
    """A running replica: where it listens and what it was configured with."""

    kind: Kind
    url: str
    model: str = SERVED_MODEL_NAME
    block_size: int = BLOCK_SIZE
    num_gpu_blocks: int = NUM_GPU_BLOCKS
    kv_events_endpoint: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    kv_replay_endpoint: str | None = None


def vllm_config(model: Path, *, kv_events: bool = True) -> VllmConfig:
    """The real replica's settings matching :func:`sim_config`."""
    return VllmConfig(
        served_model_name=SERVED_MODEL_NAME,
        model=model,
        max_model_len=MAX_MODEL_LEN,
        num_gpu_blocks_override=NUM_GPU_BLOCKS,
        kv_events=kv_events,
    )


def sim_config(tokenizer: Path | None, *, kv_events: bool = True) -> SimConfig:
    """A simulator configured like the real replica: same tokenizer, block size, blocks and limits."""
    return SimConfig(
        served_model_name=SERVED_MODEL_NAME,
        block_size=BLOCK_SIZE,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        max_num_batched_tokens=CPU_MAX_NUM_BATCHED_TOKENS,
        max_num_seqs=CPU_MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN,
        tokenizer=str(tokenizer) if tokenizer is not None else None,
        kv_events_endpoint="tcp://127.0.0.1:*" if kv_events else None,
        kv_events_replay_endpoint="tcp://127.0.0.1:*" if kv_events else None,
        time_scale=1.0,
    )


@contextmanager
def sim_backend(tokenizer: Path | None, *, kv_events: bool = True) -> Iterator[Backend]:
    """One simulated replica configured like the real one."""
    with SimPool(1, sim_config(tokenizer, kv_events=kv_events)) as pool:
        yield Backend(
            "sim",
            pool.urls[0],
            kv_events_endpoint=pool.kv_events_endpoints[0],
            kv_replay_endpoint=pool.kv_events_replay_endpoints[0],
        )


def vllm_backend(pool: VllmPool) -> Backend:
    """The first replica of a running real pool."""
    replica = pool.replicas[0]
    blocks = pool.config.num_gpu_blocks_override or 0
    return Backend(
        "vllm",
        replica.url,
        model=pool.model,
        num_gpu_blocks=blocks,
        kv_events_endpoint=replica.kv_events_endpoint,
        kv_replay_endpoint=replica.kv_replay_endpoint,
    )


# -- small HTTP helpers --------------------------------------------------------------------------------
async def sse_chunks(
    client: httpx.AsyncClient, url: str, body: dict[str, Any]
) -> tuple[list[dict[str, Any]], bool]:
    """POST a streaming request; the decoded `data:` chunks and whether `[DONE]` ended the stream."""
    chunks: list[dict[str, Any]] = []
    done = False
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            raise AssertionError(f"{url}: {response.status_code} {(await response.aread())[:300]!r}")
        async for data in aiter_data(response.aiter_bytes()):
            if data == DONE:
                done = True
                continue
            if done:
                raise AssertionError("data after [DONE]")
            chunk = json.loads(data)
            if "error" in chunk:
                raise AssertionError(f"{url}: error event {chunk['error']}")
            chunks.append(chunk)
    return chunks, done


async def tokenize(client: httpx.AsyncClient, backend: Backend, **body: Any) -> list[int]:
    """Token ids of `prompt=` or `messages=` (chat template applied) as the replica counts them."""
    response = await client.post(f"{backend.url}/tokenize", json={"model": backend.model, **body})
    response.raise_for_status()
    data = response.json()
    tokens = [int(t) for t in data["tokens"]]
    if data["count"] != len(tokens):
        raise AssertionError(f"/tokenize count {data['count']} != {len(tokens)} tokens")
    return tokens


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


async def metric_samples(client: httpx.AsyncClient, backend: Backend) -> list[Sample]:
    response = await client.get(f"{backend.url}/metrics")
    response.raise_for_status()
    return [
        Sample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    ]


def total(samples: list[Sample], name: str, **labels: str) -> float:
    """Sum of the samples named `name` whose labels include `labels`."""
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


async def settled_samples(
    client: httpx.AsyncClient, backend: Backend, before: list[Sample], finished: int, timeout_s: float = 10.0
) -> list[Sample]:
    """Samples once `finished` more requests count as finished (counters land just after a stream ends)."""
    base = total(before, "vllm:request_success_total")
    with anyio.fail_after(timeout_s):
        while True:
            after = await metric_samples(client, backend)
            if total(after, "vllm:request_success_total") - base >= finished:
                return after
            await anyio.sleep(0.05)


# -- KV events -----------------------------------------------------------------------------------------
@asynccontextmanager
async def kv_subscriber(endpoint: str) -> AsyncIterator[zmq.asyncio.Socket]:
    """A SUB socket connected to a replica's KV-event publisher, subscribed to every topic."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.SUB)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(endpoint)
        yield sock
    finally:
        sock.close(linger=0)
        ctx.term()


async def next_message(sock: zmq.asyncio.Socket, timeout_s: float) -> KVEventMessage | None:
    """The next decoded message, or None if none arrives within `timeout_s`."""
    if not await sock.poll(timeout=int(timeout_s * 1000)):
        return None
    frames = await sock.recv_multipart()
    return decode_message(frames)
