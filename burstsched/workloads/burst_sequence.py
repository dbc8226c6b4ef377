"""A sequence of bursts through one router, with direct side traffic to the replicas and set timings.

Each burst is ``k`` streamed chat requests sharing a new ~``prefix_tokens`` context, each with its own short
question (workloads.md §2). Around them, as a user's client does:

- *between* bursts (``side_traffic``): the burst's context sized with ``POST /tokenize`` on the first replica
  (a few calls), each question tokenized there too, then every replica's ``/metrics`` read;
- *during* bursts (``side_traffic``): a second client keeps calling the first replica directly
  (``/tokenize`` of a long text, a short completion, ``/metrics``) until the burst's last answer;
- ``gap_s`` between one burst's last answer and the next burst (0: back to back);
- ``spread_ms``: the burst's requests leave over this many milliseconds, evenly, instead of at once (the
  arrival spread a loaded client or network gives);
- ``background_rate``: Poisson background requests through the router for the whole sequence.

A burst counts as kept together when every request went to one replica; its prefix computations are the
requests' computed prompt tokens (``prompt_tokens − cached_tokens`` from each stream's usage, so direct side
traffic does not count) over the context's tokens.
"""

from __future__ import annotations

import random
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from burstsched.workloads.burst import QUESTIONS, background_load
from burstsched.workloads.contexts import context_text, sized_context
from burstsched.workloads.stream_client import StreamResult, chat_body, stream_chat


@dataclass(frozen=True, slots=True)
class SequenceSpec:
    """One sequence: ``bursts`` bursts of ``k`` requests, with their timings and side traffic."""

    bursts: int = 20
    k: int = 8
    prefix_tokens: int = 4000
    max_tokens: int = 16
    gap_s: float = 0.0
    spread_ms: float = 0.0
    side_traffic: bool = True
    background_rate: float = 0.0
    background_tokens: int = 1000

    def label(self) -> str:
        parts = [f"gap {self.gap_s:g}s", f"spread {self.spread_ms:g}ms"]
        parts.append("side traffic" if self.side_traffic else "no side traffic")
        if self.background_rate > 0:
            parts.append(f"background {self.background_rate:g}/s")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class BurstRecord:
    """One burst of the sequence as the client saw it."""

    prefix_tokens: int
    results: tuple[StreamResult, ...]

    @property
    def per_replica(self) -> dict[str, int]:
        return dict(Counter(r.endpoint or "?" for r in self.results))

    @property
    def together(self) -> bool:
        return len(self.per_replica) == 1

    @property
    def compute_ratio(self) -> float:
        computed = 0
        for r in self.results:
            usage = r.usage or {}
            computed += int(usage.get("prompt_tokens", 0)) - (r.cached_tokens or 0)
        return computed / self.prefix_tokens

    @property
    def failed(self) -> int:
        return sum(1 for r in self.results if r.status != 200 or r.error is not None or r.usage is None)


@dataclass(slots=True)
class SequenceOutcome:
    spec: SequenceSpec
    bursts: list[BurstRecord]
    side_requests: int = 0
    side_failures: int = 0

    def summary(self) -> dict[str, Any]:
        ratios = [b.compute_ratio for b in self.bursts]
        return {
            "timing": self.spec.label(),
            "bursts": len(self.bursts),
            "together": sum(b.together for b in self.bursts),
            "ratio_median": statistics.median(ratios) if ratios else float("nan"),
            "ratio_max": max(ratios) if ratios else float("nan"),
            "splits": ["/".join(str(n) for n in sorted(b.per_replica.values())) for b in self.bursts],
            "ratios": [round(r, 3) for r in ratios],
            "failed": sum(b.failed for b in self.bursts),
            "side_requests": self.side_requests,
            "side_failures": self.side_failures,
        }


class SideTraffic:
    """Direct calls to the replicas, beside the router: what a user's own tooling sends them."""

    def __init__(self, client: httpx.AsyncClient, replicas: Sequence[str], model: str) -> None:
        self._client = client
        self._replicas = list(replicas)
        self._model = model
        self.requests = 0
        self.failures = 0

    async def _call(self, method: str, url: str, body: dict[str, Any] | None = None) -> httpx.Response | None:
        self.requests += 1
        try:
            response = await self._client.request(method, url, json=body)
        except httpx.HTTPError:
            self.failures += 1
            return None
        if response.status_code != 200:
            self.failures += 1
        return response

    async def count_tokens(self, text: str) -> int:
        """``POST /tokenize`` on the first replica, as a chat message."""
        body = {"model": self._model, "messages": [{"role": "user", "content": text}]}
        response = await self._call("POST", f"{self._replicas[0]}/tokenize", body)
        if response is None or response.status_code != 200:
            raise RuntimeError("the first replica's /tokenize failed")
        return int(response.json()["count"])

    async def read_metrics(self) -> None:
        for url in self._replicas:
            await self._call("GET", f"{url}/metrics")

    async def before_burst(self, questions: Sequence[str]) -> None:
        """Each question tokenized on the first replica, then every replica's metrics read."""
        for question in questions:
            await self.count_tokens(question)
        await self.read_metrics()

    async def during(self, stop: anyio.Event, rng: random.Random) -> None:
        """Until ``stop``: tokenize a long text, a short direct completion and a metrics read, on the first
        replica, with short random pauses."""
        long_text = context_text(f"side-{uuid.uuid4().hex[:8]}", 60, 0)
        first = self._replicas[0]
        while not stop.is_set():
            choice = rng.randrange(3)
            body: dict[str, Any]
            if choice == 0:
                body = {"model": self._model, "prompt": long_text}
                await self._call("POST", f"{first}/tokenize", body)
            elif choice == 1:
                body = {"model": self._model, "prompt": f"side {rng.random()}", "max_tokens": 2}
                await self._call("POST", f"{first}/v1/completions", body)
            else:
                await self._call("GET", f"{first}/metrics")
            with anyio.move_on_after(rng.uniform(0.002, 0.02)):
                await stop.wait()


async def run_sequence(
    client: httpx.AsyncClient,
    router_url: str,
    replicas: Sequence[str],
    model: str,
    spec: SequenceSpec,
    *,
    rng: random.Random,
    tag: str = "seq",
) -> SequenceOutcome:
    """Send ``spec.bursts`` bursts through ``router_url``; replicas' URLs for the side traffic."""
    side = SideTraffic(client, replicas, model)
    outcome = SequenceOutcome(spec, [])
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(spec.k)]
    prepared: list[tuple[str, int]] = []
    if not spec.side_traffic:  # every context sized up front: nothing reaches a replica between bursts
        for b in range(spec.bursts):
            prepared.append(await _context(side, f"{tag}-{b}", spec.prefix_tokens, b))
    stop_background = anyio.Event()
    background: list[tuple[float, StreamResult]] = []
    async with anyio.create_task_group() as tg:
        if spec.background_rate > 0:
            tg.start_soon(
                background_load,
                client,
                router_url,
                model,
                spec.background_rate,
                spec.background_tokens,
                stop_background,
                background,
                random.Random(rng.random()),
            )
        for b in range(spec.bursts):
            if b > 0 and spec.gap_s > 0:
                await anyio.sleep(spec.gap_s)
            if spec.side_traffic:
                context, tokens = await _context(side, f"{tag}-{b}", spec.prefix_tokens, b)
                await side.before_burst(questions)
            else:
                context, tokens = prepared[b]
            prompts = [context + q for q in questions]
            results = await _fire(client, router_url, model, prompts, spec, side, rng, f"{tag}-{b}")
            outcome.bursts.append(BurstRecord(tokens, tuple(results)))
        stop_background.set()
    outcome.side_requests, outcome.side_failures = side.requests, side.failures
    return outcome


async def _context(side: SideTraffic, uid: str, tokens: int, variant: int) -> tuple[str, int]:
    unique = f"{uid}-{uuid.uuid4().hex[:8]}"
    context = await sized_context(unique, tokens, variant, side.count_tokens)
    return context, await side.count_tokens(context)


async def _fire(
    client: httpx.AsyncClient,
    router_url: str,
    model: str,
    prompts: Sequence[str],
    spec: SequenceSpec,
    side: SideTraffic,
    rng: random.Random,
    tag: str,
) -> list[StreamResult]:
    results: list[StreamResult | None] = [None] * len(prompts)
    step = spec.spread_ms / 1000 / max(1, len(prompts) - 1)
    stop_side = anyio.Event()
    start = time.perf_counter()

    async def one(i: int, prompt: str) -> None:
        delay = start + i * step - time.perf_counter()
        if delay > 0:
            await anyio.sleep(delay)
        body = chat_body(model, prompt, spec.max_tokens)
        results[i] = await stream_chat(client, router_url, body, f"{tag}-{i}-{uuid.uuid4().hex[:8]}")

    async with anyio.create_task_group() as outer:
        if spec.side_traffic:
            outer.start_soon(side.during, stop_side, random.Random(rng.random()))
        async with anyio.create_task_group() as burst:
            for i, prompt in enumerate(prompts):
                burst.start_soon(one, i, prompt)
        stop_side.set()
    return [r for r in results if r is not None]
