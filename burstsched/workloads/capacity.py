"""A pool's cold capacity: the request rate it sustains when no request hits the prefix cache.

Measured, not assumed: each replica gets its own share of distinct, never-seen prompts straight (no
router), one at a time, all replicas at once; a replica's rate is its requests over its busy time, and
the pool's capacity is the sum. One request in flight per replica keeps batching out of the figure, so it
is the prefill-bound worst case: any routing policy serves at least this rate, and a load of 1.0 relative
to it is where a policy that never hits the cache saturates. Each replica first serves ``warmup`` uncounted
prompts: a freshly started vLLM's first requests are several times slower than the steady state (measured
here: 559 ms against 165 ms mean cold service for the same 2.3k-2.9k-token documents). Caller resets the
caches afterwards.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio
import httpx

from burstsched.workloads.stream_client import chat_body, stream_chat
from burstsched.workloads.targets import Endpoints


class CapacityError(RuntimeError):
    """A calibration request failed, so no capacity could be measured."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """Requests per second the pool sustains cold, and the mean cold service time behind it."""

    requests_per_s: float
    mean_service_s: float
    samples: int

    def as_json(self) -> dict[str, float | int | str]:
        return {
            "requests_per_s": self.requests_per_s,
            "mean_service_s": self.mean_service_s,
            "samples": self.samples,
            "method": "cold: distinct prompts, one in flight per replica, straight to each replica",
        }


async def measure_cold_capacity(
    client: httpx.AsyncClient,
    endpoints: Endpoints,
    model: str,
    prompts: Sequence[str],
    max_tokens: int,
    *,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> Capacity:
    """Send ``prompts`` (distinct, uncached) round-robin over the replicas, one at a time per replica; the
    first ``warmup`` of each replica's share are not counted."""
    if len(prompts) < len(endpoints) * (warmup + 1):
        raise ValueError("at least warmup + 1 calibration prompts per replica")
    shares = [list(prompts[i :: len(endpoints)]) for i in range(len(endpoints))]
    busy = [0.0] * len(endpoints)
    durations: list[float] = []

    async def send(url: str, prompt: str) -> float:
        body = chat_body(model, prompt, max_tokens)
        result = await stream_chat(client, url, body, f"capacity-{uuid.uuid4().hex[:12]}", clock)
        if result.status != 200 or result.error is not None:
            raise CapacityError(f"calibration request to {url} failed: {result.status} {result.error}")
        return result.e2e_s

    async def replica(i: int, url: str) -> None:
        for prompt in shares[i][:warmup]:
            await send(url, prompt)
        start = clock()
        for prompt in shares[i][warmup:]:
            durations.append(await send(url, prompt))
        busy[i] = clock() - start

    async with anyio.create_task_group() as tg:
        for i, (_, url) in enumerate(endpoints):
            tg.start_soon(replica, i, url)
    rate = sum(
        (len(share) - warmup) / elapsed for share, elapsed in zip(shares, busy, strict=True) if elapsed > 0
    )
    return Capacity(rate, sum(durations) / len(durations), len(durations))
