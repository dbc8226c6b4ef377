"""Fresh long contexts for prefix-cache experiments: unique, made of many distinct observations."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

_SYSTEMS = (
    "ingest gateway",
    "payment ledger",
    "search indexer",
    "video transcoder",
    "metrics pipeline",
    "auth service",
    "billing export",
    "feature store",
    "object storage",
    "message queue",
)
_SIGNALS = (
    "p99 latency",
    "error rate",
    "queue depth",
    "cache hit ratio",
    "GC pause time",
    "disk utilisation",
    "open connections",
    "retry count",
    "CPU saturation",
    "memory resident set",
)
_CHANGES = ("rose", "fell", "spiked", "flattened", "oscillated", "drifted upward", "dropped sharply")
_CAUSES = (
    "after a config rollout",
    "during the nightly batch",
    "while a node was draining",
    "when traffic shifted regions",
    "after a dependency upgrade",
    "under a synthetic load test",
    "with no change deployed",
)


def observation(rng: random.Random, index: int) -> str:
    """One distinct operations observation."""
    return (
        f"Observation {index}: on host {rng.choice(_SYSTEMS)}-{rng.randrange(100, 999)} the "
        f"{rng.choice(_SIGNALS)} {rng.choice(_CHANGES)} from {rng.randrange(1, 500)} to "
        f"{rng.randrange(1, 500)} {rng.choice(_CAUSES)} at {rng.randrange(0, 24):02d}:"
        f"{rng.randrange(0, 60):02d} UTC."
    )


def context_text(uid: str, lines: int, seed: int) -> str:
    """A context of ``lines`` observations, starting with a unique id."""
    rng = random.Random(f"{uid}:{seed}")
    body = "\n".join(observation(rng, i) for i in range(lines))
    return f"Context {uid}. Operations log follows.\n{body}"


async def sized_context(
    uid: str, target_tokens: int, seed: int, count_tokens: Callable[[str], Awaitable[int]]
) -> str:
    """The shortest context with at least ``target_tokens`` tokens, as ``count_tokens`` counts them."""
    low, high = 1, 16
    while await count_tokens(context_text(uid, high, seed)) < target_tokens:
        low, high = high, high * 2
    while low < high:
        mid = (low + high) // 2
        if await count_tokens(context_text(uid, mid, seed)) >= target_tokens:
            high = mid
        else:
            low = mid + 1
    return context_text(uid, high, seed)
