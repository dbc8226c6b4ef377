"""Five of llm-d's own configs, loaded as they are, route the same requests as llm-d's rules say.

Each config runs in front of three simulated replicas; the same seeded sequence of completions (new
documents, documents asked again, documents half reused) goes through it one request at a time, and each
request's endpoint is held against a reference written here from llm-d's plugin documentation, not from
burstsched's plugins:

- the approximate prefix index records the full blocks (``blockSizeTokens`` 64, four characters a token) of
  every prompt sent to an endpoint; ``prefix-cache-scorer`` = leading blocks matched / prompt blocks;
- ``queue-scorer`` = (max − q) / (max − min), 1 when all are equal; ``kv-cache-utilization-scorer`` =
  1 − usage; ``load-aware-scorer`` = 0.5 for an empty queue; ``active-request-scorer`` = 1 at or below
  ``idleThreshold`` requests; ``token-load-scorer`` = 1 − in-flight tokens / ``queueThresholdTokens``;
- ``no-hit-lru-scorer``: a request no endpoint has a block of is cold; cold requests rank endpoints never
  given a cold request first, then the least recently given one; warm requests score 0.5 everywhere;
- ``prefix-cache-affinity-filter``: keep the endpoints whose prefix score is at least ``affinityThreshold``,
  all when none is (exploration 0, no load in flight to break stickiness);
- ``max-score-picker``: the highest weighted sum, ties broken at random, so where several endpoints tie
  the reference predicts the set and the router's pick must be in it.

Between requests the test waits until every endpoint is idle in the router's view (a scrape after the last
response, nothing in flight), so the load scorers see the idle pool the reference assumes.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from burstsched.config import EndpointConfig, parse_config_document
from burstsched.server.serve import RunningRouter, running_router
from burstsched.sim import SimConfig, SimPool
from tests.router.helpers import FAST_POOL, eventually

pytestmark = pytest.mark.anyio
CORPUS = Path(__file__).resolve().parent / "llmd_corpus"
BLOCK_BYTES = 64 * 4  # llm-d's approximate producer: blockSizeTokens 64, 4 characters a token
REQUESTS = 24


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Reference:
    """llm-d's view of the pool, kept from the endpoints the router actually chose."""

    names: list[str]
    sent: dict[str, list[bytes]] = field(default_factory=dict)
    cold_lru: list[str] = field(default_factory=list)  # endpoints given a cold request, oldest first

    def matched(self, endpoint: str, prompt: bytes) -> int:
        blocks = len(prompt) // BLOCK_BYTES
        best = 0
        for earlier in self.sent.get(endpoint, []):
            common = 0
            for a, b in zip(prompt, earlier, strict=False):
                if a != b:
                    break
                common += 1
            best = max(best, common // BLOCK_BYTES)
        return min(best, blocks)

    def prefix(self, endpoint: str, prompt: bytes) -> float:
        blocks = len(prompt) // BLOCK_BYTES
        return self.matched(endpoint, prompt) / blocks if blocks else 0.0

    def cold(self, prompt: bytes) -> bool:
        return all(self.matched(e, prompt) == 0 for e in self.names)

    def no_hit_lru(self, endpoint: str, prompt: bytes) -> float:
        if not self.cold(prompt):
            return 0.5
        never = [e for e in self.names if e not in self.cold_lru]
        if endpoint in never:
            return 1.0  # llm-d ranks the never-used ones in its own list order: a tie here
        rank = len(never) + self.cold_lru.index(endpoint)
        return 1.0 - rank / (len(self.names) - 1)

    def record(self, endpoint: str, prompt: bytes, was_cold: bool) -> None:
        self.sent.setdefault(endpoint, []).append(prompt)
        if was_cold:
            if endpoint in self.cold_lru:
                self.cold_lru.remove(endpoint)
            self.cold_lru.append(endpoint)


Score = Callable[[Reference, str, bytes], float]


def _idle_queue(_r: Reference, _e: str, _p: bytes) -> float:
    return 1.0  # every queue 0: max == min


def _idle_kv(_r: Reference, _e: str, _p: bytes) -> float:
    return 1.0 - 0.0


def _idle_load_aware(_r: Reference, _e: str, _p: bytes) -> float:
    return 0.5  # waitingRequests == 0


def _idle_active(_r: Reference, _e: str, _p: bytes) -> float:
    return 1.0  # 0 active requests <= idleThreshold 0


def _idle_token_load(_r: Reference, _e: str, _p: bytes) -> float:
    return 1.0 - min(1.0, 0 / 4194304)


def _prefix(r: Reference, e: str, p: bytes) -> float:
    return r.prefix(e, p)


def _lru(r: Reference, e: str, p: bytes) -> float:
    return r.no_hit_lru(e, p)


@dataclass(frozen=True)
class Rules:
    """One config's profile as its llm-d file writes it: (weight, scorer), and an affinity threshold."""

    scorers: tuple[tuple[float, Score], ...]
    affinity_threshold: float | None = None


RULES: dict[str, Rules] = {
    # the chart's default: queue 2, kv-cache-utilization 2, prefix-cache 3
    "router-chart-default-plugins.yaml": Rules(((2, _idle_queue), (2, _idle_kv), (3, _prefix))),
    # deploy/config: prefix-cache 1, load-aware 1
    "router-deploy-epp-estimate-prefix-cache-config.yaml": Rules(((1, _prefix), (1, _idle_load_aware))),
    # the spec-decoding guide: queue 2, kv 2, prefix 3, no-hit-lru 2
    "guide-spec-decoding.yaml": Rules(((2, _idle_queue), (2, _idle_kv), (3, _prefix), (2, _lru))),
    # wide-EP aggregated: prefix 3, queue 2, active-request 2
    "guide-wide-ep-aggregated.yaml": Rules(((3, _prefix), (2, _idle_queue), (2, _idle_active))),
    # optimized baseline: prefix-cache-affinity-filter 0.80, then token-load (weight 1)
    "guide-optimized-baseline.yaml": Rules(((1, _idle_token_load),), affinity_threshold=0.8),
}


def predict(rules: Rules, ref: Reference, prompt: bytes) -> set[str]:
    candidates = list(ref.names)
    if rules.affinity_threshold is not None:
        sticky = [e for e in candidates if ref.prefix(e, prompt) >= rules.affinity_threshold]
        candidates = sticky or candidates
    totals = {e: sum(w * score(ref, e, prompt) for w, score in rules.scorers) for e in candidates}
    best = max(totals.values())
    return {e for e, total in totals.items() if total >= best - 1e-9}


def _text(rng: random.Random, size: int) -> str:
    words: list[str] = []
    length = 0
    while length < size:
        words.append(f"w{rng.randrange(100_000)}")
        length += len(words[-1]) + 1
    return " ".join(words)[:size]


def workload(seed: int) -> list[str]:
    """New documents, documents asked again (all blocks matched) and half reused (fewer than 80%)."""
    rng = random.Random(seed)
    documents: list[str] = []
    prompts: list[str] = []
    for i in range(REQUESTS):
        kind = "new" if len(documents) < 2 else rng.choice(("new", "again", "again", "half"))
        if kind == "new":
            documents.append(_text(rng, 1200))
            prompts.append(f"{documents[-1]} Q{i}?")
        elif kind == "again":
            prompts.append(f"{rng.choice(documents)} Q{i}?")
        else:
            prompts.append(f"{rng.choice(documents)[:600]} {_text(rng, 700)} Q{i}?")
    return prompts


async def _idle_since(router: RunningRouter, done: float) -> None:
    """Every endpoint idle in the router's view, through a scrape taken after ``done``."""
    pool = router.app.state.router.pool

    async def idle() -> bool:
        now = time.monotonic()
        return all(
            s.healthy
            and s.metrics_age < now - done
            and (s.waiting, s.running, s.in_flight, s.pending, s.queued_prefill_tokens) == (0, 0, 0, 0, 0)
            and s.kv_usage == 0.0
            for s in pool.snapshots()
        )

    await eventually(idle, within_s=10)


@pytest.mark.parametrize("file", sorted(RULES))
async def test_routing_follows_llm_d_rules(file: str) -> None:
    loaded = parse_config_document((CORPUS / file).read_text(encoding="utf-8"), source=file)
    rules = RULES[file]
    prompts = workload(seed=11)
    async with SimPool(3, SimConfig(time_scale=0.01, seed=1)) as sims:
        endpoints = [EndpointConfig(name=n, url=u) for n, u in zip(sims.names, sims.urls, strict=True)]
        config = loaded.config.model_copy(update={"endpoints": endpoints, "pool": FAST_POOL})
        ref = Reference(list(sims.names))
        unique = 0
        async with (
            running_router(config, rng=random.Random(5)) as router,
            httpx.AsyncClient(base_url=router.url, timeout=30) as client,
        ):
            await _idle_since(router, time.monotonic())
            for i, text in enumerate(prompts):
                prompt = text.encode()
                expected = predict(rules, ref, prompt)
                body = {"model": "kv-demo", "prompt": text, "max_tokens": 1}
                response = await client.post("/v1/completions", json=body)
                done = time.monotonic()
                assert response.status_code == 200, response.text
                chosen = response.headers["x-burstsched-endpoint"]
                assert chosen in expected, f"request {i}: {chosen}, llm-d's rules: {sorted(expected)}"
                unique += len(expected) == 1
                ref.record(chosen, prompt, ref.cold(prompt))
                await _idle_since(router, done)
    assert unique >= REQUESTS // 2  # most choices are forced by the rules, not left to the tie-break
