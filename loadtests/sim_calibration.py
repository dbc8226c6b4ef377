"""Calibration check of the simulator against the seed measurement (cold ~2.0 s, warm ~130 ms TTFT).

Starts its own one-replica SimPool and, per round, sends the seed experiment's pair to it:
``C + Q1`` on a fresh ~5200-token context C (cold), then ``C + Q2`` (warm: only the last partial
block and the new question are computed), both streamed with ``max_tokens`` 32 and usage. Prints the
client-side TTFT (request sent → first non-empty content delta) of both, their ratio, and the time
from the first content delta to the end of the 32 tokens. Bounded: every request has a timeout and
the whole run a deadline.

    .venv/bin/python loadtests/sim_calibration.py [--time-scale 1.0] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import uuid
from dataclasses import dataclass

import httpx

from burstsched.sim import SimConfig, SimPool
from burstsched.wire.sse import DONE, aiter_data

MODEL = "kv-demo"
TARGET_TOKENS = 5200
MAX_TOKENS = 32


@dataclass(frozen=True, slots=True)
class Timing:
    ttft_s: float
    decode_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


def context(uid: str, lines: int) -> str:
    rng = random.Random(uid)
    systems = ("ingest gateway", "payment ledger", "search indexer", "feature store", "message queue")
    signals = ("p99 latency", "error rate", "queue depth", "cache hit ratio", "GC pause time")
    body = "\n".join(
        f"Observation {i}: on host {rng.choice(systems)}-{rng.randrange(100, 999)} the {rng.choice(signals)} "
        f"moved from {rng.randrange(1, 500)} to {rng.randrange(1, 500)} at {rng.randrange(24):02d}:00 UTC."
        for i in range(lines)
    )
    return f"Context {uid}. Operations log follows.\n{body}"


async def count_tokens(client: httpx.AsyncClient, url: str, text: str) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    response = await client.post(f"{url}/tokenize", json=body)
    response.raise_for_status()
    return int(response.json()["count"])


async def sized_context(client: httpx.AsyncClient, url: str, uid: str) -> str:
    low, high = 1, 64
    while await count_tokens(client, url, context(uid, high)) < TARGET_TOKENS:
        low, high = high, high * 2
    while low < high:
        mid = (low + high) // 2
        if await count_tokens(client, url, context(uid, mid)) >= TARGET_TOKENS:
            high = mid
        else:
            low = mid + 1
    return context(uid, high)


async def timed_chat(client: httpx.AsyncClient, url: str, prompt: str) -> Timing:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    first: float | None = None
    last = sent
    use: dict[str, object] = {}
    headers = {"X-Request-Id": uuid.uuid4().hex}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as response:
        response.raise_for_status()
        async for data in aiter_data(response.aiter_bytes()):
            if data == DONE:
                continue
            chunk = json.loads(data)
            if chunk.get("usage"):
                use = chunk["usage"]
            for choice in chunk.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    now = time.perf_counter()
                    first = now if first is None else first
                    last = now
    if first is None:
        raise RuntimeError("no content in the stream")
    details = use.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens", 0)) if isinstance(details, dict) else 0
    return Timing(
        ttft_s=first - sent,
        decode_s=last - first,
        prompt_tokens=int(str(use.get("prompt_tokens", 0))),
        cached_tokens=cached,
        completion_tokens=int(str(use.get("completion_tokens", 0))),
    )


def ms(values: list[float]) -> str:
    p50, low, high = statistics.median(values) * 1e3, min(values) * 1e3, max(values) * 1e3
    return f"p50 {p50:7.1f} ms  (min {low:.1f}, max {high:.1f})"


async def main(time_scale: float, rounds: int) -> int:
    config = SimConfig(time_scale=time_scale)
    async with SimPool(1, config) as pool:
        url = pool.urls[0]
        async with httpx.AsyncClient(timeout=httpx.Timeout(60.0 + 10 * time_scale)) as client:
            cold: list[Timing] = []
            warm: list[Timing] = []
            for r in range(rounds):
                ctx = await sized_context(client, url, f"cal-{r}-{uuid.uuid4().hex[:8]}")
                cold.append(await timed_chat(client, url, ctx + "\nQuestion: Summarize the observations."))
                warm.append(
                    await timed_chat(
                        client, url, ctx + "\nQuestion: Which measurements should engineers collect next?"
                    )
                )
    scale = time_scale or 1.0
    print(f"simulator calibration at time scale {time_scale} ({rounds} rounds, one replica, concurrency 1)")
    print(
        f"prompt tokens: cold {cold[0].prompt_tokens}, warm {warm[0].prompt_tokens} "
        f"(warm cached {warm[0].cached_tokens}, computed {warm[0].prompt_tokens - warm[0].cached_tokens})"
    )
    print(f"cold TTFT            {ms([t.ttft_s for t in cold])}")
    print(f"warm TTFT            {ms([t.ttft_s for t in warm])}")
    ratio = statistics.median(t.ttft_s for t in cold) / statistics.median(t.ttft_s for t in warm)
    print(f"cold / warm ratio    {ratio:.1f}x")
    decode = [t.decode_s for t in cold + warm]
    print(f"{MAX_TOKENS} tokens after first {ms(decode)}")
    if time_scale not in (0.0, 1.0):
        print(f"(at time scale 1 these would be about {1 / scale:.0f}x longer)")
    return 0


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--deadline-s", type=float, default=300.0, help="abort the whole run after this long")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(asyncio.wait_for(main(args.time_scale, args.rounds), args.deadline_s))
    except TimeoutError:
        print(f"calibration did not finish within {args.deadline_s} s", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(cli())
