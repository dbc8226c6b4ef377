"""The replicas' state around a run: counter snapshots, the KV-cache geometry, prefix-cache resets.

Shared by every workload that measures a pool through its replicas' ``/metrics`` (document QA, the
multi-tenant chat, the replays): snapshots before and after a run give each replica's counter deltas, and
a reset between targets gives each one the same cold start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

from burstsched.workloads.replica_metrics import ReplicaCounters, read_counters
from burstsched.workloads.targets import Endpoints


async def snapshot(client: httpx.AsyncClient, endpoints: Endpoints) -> dict[str, ReplicaCounters]:
    """Every replica's counters, by replica name."""
    return {name: await read_counters(client, url) for name, url in endpoints}


async def settled_snapshot(
    client: httpx.AsyncClient,
    endpoints: Endpoints,
    before: Mapping[str, ReplicaCounters],
    finished: int,
    timeout_s: float = 10.0,
) -> dict[str, ReplicaCounters]:
    """Counters once ``finished`` more requests count as finished (they land just after a stream ends),
    or whatever they are after ``timeout_s``."""
    after = await snapshot(client, endpoints)
    with anyio.move_on_after(timeout_s):
        while sum(after[n].requests_finished - before[n].requests_finished for n in after) < finished:
            await anyio.sleep(0.05)
            after = await snapshot(client, endpoints)
    return after


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """A replica's KV-cache geometry from ``vllm:cache_config_info``."""

    block_size: int
    num_gpu_blocks: int


async def read_cache_config(client: httpx.AsyncClient, base_url: str) -> CacheConfig:
    response = await client.get(f"{base_url}/metrics")
    response.raise_for_status()
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name.startswith("vllm:cache_config_info"):
                labels = sample.labels
                return CacheConfig(int(labels["block_size"]), int(labels.get("num_gpu_blocks") or 0))
    raise ValueError(f"{base_url}/metrics has no vllm:cache_config_info")


class ResetError(RuntimeError):
    """A replica would not reset its prefix cache in time."""


async def reset_prefix_caches(
    client: httpx.AsyncClient,
    urls: Sequence[str],
    timeout_s: float = 60.0,
    interval_s: float = 0.2,
    *,
    model: str | None = None,
) -> None:
    """POST ``/reset_prefix_cache`` to each replica until it answers ``{"success": true}`` (vLLM refuses
    while requests hold blocks); :class:`ResetError` after ``timeout_s``.

    With ``model``, one one-token request then goes to each replica: vLLM publishes the reset's
    ``AllBlocksCleared`` event with its next engine step, and an idle engine runs none, so a router that
    follows (or replays) the events would otherwise still believe the replica holds what it held before."""
    for url in urls:
        last = ""
        with anyio.move_on_after(timeout_s):
            while True:
                try:
                    response = await client.post(f"{url}/reset_prefix_cache")
                    last = f"{response.status_code} {response.text[:200]}"
                    if response.status_code == 200 and _success(response):
                        break
                except httpx.HTTPError as exc:
                    last = repr(exc)
                await anyio.sleep(interval_s)
            continue
        raise ResetError(f"{url}: prefix cache not reset after {timeout_s} s (last answer: {last})")
    if model is not None:
        for url in urls:
            body = {"model": model, "prompt": "reset", "max_tokens": 1}
            (await client.post(f"{url}/v1/completions", json=body)).raise_for_status()


def _success(response: httpx.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("success") is True
