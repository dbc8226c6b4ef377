"""Bursts (workloads.md §2): K requests sharing a new long prefix, sent at once, on an idle or busy pool.

Per burst request the usage chunk says how many prompt tokens the replica computed
(``prompt_tokens − cached_tokens``), so the burst's own prefill is counted exactly even while
background traffic runs; ``compute_ratio`` is that sum over the burst divided by the shared
prefix's tokens (≈ 1.1 when the prefix is computed once, given block rounding and the tails).
"""

from __future__ import annotations

import math
import random
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import httpx

from burstsched.workloads.contexts import context_text, sized_context
from burstsched.workloads.stats import percentile
from burstsched.workloads.stream_client import StreamResult, chat_body, stream_chat

SharedMode = Literal["identical", "system"]

QUESTIONS = tuple(
    f"\nQuestion {i}: " + q
    for i, q in enumerate(
        (
            "What changed first?",
            "Which host looks worst?",
            "List three likely causes.",
            "What should be rolled back?",
            "Which signal is noise?",
            "Who should be paged?",
            "What is the blast radius?",
            "Which metric leads the others?",
        )
        * 8
    )
)


@dataclass(frozen=True, slots=True)
class BurstSpec:
    """One scenario: ``bursts`` distinct prefixes, each sent ``k`` times at the same moment."""

    k: int
    bursts: int = 1
    mode: SharedMode = "identical"
    prefix_tokens: int = 4000
    document_tokens: int = 600
    max_tokens: int = 32


@dataclass(slots=True)
class BurstOutcome:
    """The measured burst: its requests' streams, grouped by burst."""

    spec: BurstSpec
    prefix_tokens: list[int]
    results: list[list[StreamResult]]
    makespan_s: float
    background: list[StreamResult] = field(default_factory=list)

    def computed_tokens(self, result: StreamResult) -> int:
        usage = result.usage or {}
        cached = result.cached_tokens or 0
        return int(usage.get("prompt_tokens", 0)) - cached

    def summary(self) -> dict[str, Any]:
        all_results = [r for burst in self.results for r in burst]
        ttfts = [r.ttft_s * 1000 for r in all_results if r.ttft_s is not None]
        computed = sum(self.computed_tokens(r) for r in all_results)
        per_burst_replicas = [sorted({r.endpoint or "?" for r in burst}) for burst in self.results]
        cold_replicas = set()
        for burst, prefix in zip(self.results, self.prefix_tokens, strict=True):
            for result in burst:
                if self.computed_tokens(result) >= prefix / 2:
                    cold_replicas.add(result.endpoint or "?")
        failed = sum(1 for r in all_results if r.status != 200 or r.error is not None or r.ttft_s is None)
        bg_ttfts = [r.ttft_s * 1000 for r in self.background if r.ttft_s is not None]
        return {
            "k": self.spec.k,
            "bursts": self.spec.bursts,
            "mode": self.spec.mode,
            "compute_ratio": computed / sum(self.prefix_tokens),
            "replicas_used": len(cold_replicas),
            "replicas_per_burst": [len(r) for r in per_burst_replicas],
            "endpoints_per_burst": per_burst_replicas,
            "ttft_p50_ms": percentile(ttfts, 50),
            "ttft_p95_ms": percentile(ttfts, 95),
            "ttft_max_ms": max(ttfts) if ttfts else math.nan,
            "makespan_ms": self.makespan_s * 1000,
            "background_requests": len(self.background),
            "background_ttft_p95_ms": percentile(bg_ttfts, 95),
            "failed": failed,
        }


async def build_prompts(
    client: httpx.AsyncClient, tokenize_url: str, model: str, spec: BurstSpec, tag: str
) -> tuple[list[list[str]], list[int]]:
    """Prompts per burst and the shared prefix's token count of each burst."""

    async def count_tokens(text: str) -> int:
        response = await client.post(
            f"{tokenize_url}/tokenize", json={"model": model, "messages": [{"role": "user", "content": text}]}
        )
        response.raise_for_status()
        return int(response.json()["count"])

    prompts: list[list[str]] = []
    prefix_counts: list[int] = []
    for b in range(spec.bursts):
        uid = f"{tag}-{b}-{uuid.uuid4().hex[:8]}"
        prefix = await sized_context(uid, spec.prefix_tokens, b, count_tokens)
        prefix_counts.append(await count_tokens(prefix))
        if spec.mode == "identical":
            prompts.append([prefix + QUESTIONS[i % len(QUESTIONS)] for i in range(spec.k)])
        else:
            lines = max(1, spec.document_tokens // 40)
            prompts.append(
                [
                    prefix
                    + "\nDocument:\n"
                    + context_text(f"{uid}-doc{i}", lines, i)
                    + QUESTIONS[i % len(QUESTIONS)]
                    for i in range(spec.k)
                ]
            )
    return prompts, prefix_counts


async def fire_burst(
    client: httpx.AsyncClient, router_url: str, model: str, prompts: Sequence[Sequence[str]], max_tokens: int
) -> tuple[list[list[StreamResult]], float]:
    """Send every prompt of every burst at the same moment; return results and the makespan."""
    results: list[list[StreamResult | None]] = [[None] * len(burst) for burst in prompts]
    start = time.perf_counter()

    async def one(b: int, i: int, prompt: str) -> None:
        body = chat_body(model, prompt, max_tokens)
        results[b][i] = await stream_chat(client, router_url, body, f"burst-{b}-{i}-{uuid.uuid4().hex[:8]}")

    async with anyio.create_task_group() as tg:
        for b, burst in enumerate(prompts):
            for i, prompt in enumerate(burst):
                tg.start_soon(one, b, i, prompt)
    makespan = time.perf_counter() - start
    return [[r for r in burst if r is not None] for burst in results], makespan


async def background_load(
    client: httpx.AsyncClient,
    router_url: str,
    model: str,
    rate: float,
    prompt_tokens: int,
    stop: anyio.Event,
    out: list[tuple[float, StreamResult]],
    rng: random.Random,
    max_tokens: int = 32,
) -> None:
    """Open-loop Poisson arrivals of unique prompts until ``stop`` is set; records (start, result)."""
    lines = max(1, prompt_tokens // 40)

    async def one(n: int) -> None:
        prompt = context_text(f"bg-{uuid.uuid4().hex}", lines, n) + "\nQuestion: Summarize."
        started = time.perf_counter()
        result = await stream_chat(client, router_url, chat_body(model, prompt, max_tokens), f"bg-{n}")
        out.append((started, result))

    async with anyio.create_task_group() as tg:
        n = 0
        while not stop.is_set():
            tg.start_soon(one, n)
            n += 1
            with anyio.move_on_after(rng.expovariate(rate)):
                await stop.wait()
