"""Prefix prewarming: when a hot shared prefix is copied, where, and what a burst gains from it."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest

from burstsched.config import EndpointConfig, PoolConfig, PrewarmConfig
from burstsched.dispatch import HttpxUpstream, Prewarmer, getter
from burstsched.dispatch.prewarm import PrefixHeat, choose_copy, copy_body
from burstsched.framework import (
    ApiKind,
    Decision,
    EndpointSnapshot,
    PrefixMatch,
    SchedRequest,
    ScoredEndpoint,
)
from burstsched.pool import EndpointPool
from burstsched.server.serve import running_router
from burstsched.sim import SimConfig, SimPool
from burstsched.telemetry.metrics import RouterMetrics

from .helpers import eventually, metric, router_config, sched_request

REPO = Path(__file__).resolve().parents[2]
MODEL = "kv-demo"
CONFIG = PrewarmConfig(enabled=True, hot_requests=2, hot_window_ms=1000, cooldown_ms=5000)
CHAIN = tuple(range(100, 110))  # 10 blocks; the prefix is the first 4


def _endpoint(name: str, **load: int) -> EndpointSnapshot:
    return EndpointSnapshot(name=name, url=f"http://{name}", **load)  # type: ignore[arg-type]


def _decision(
    a_blocks: int = 10, b_blocks: int = 0, *, b_fill: float | None = 0.3, b: EndpointSnapshot | None = None
) -> Decision:
    endpoints = (_endpoint("a"), b if b is not None else _endpoint("b"))
    ranked = tuple(ScoredEndpoint(e, total=1.0 - i) for i, e in enumerate(endpoints))
    matches = {
        "a": PrefixMatch(a_blocks, len(CHAIN), 64, fill=0.5),
        "b": PrefixMatch(b_blocks, len(CHAIN), 64, fill=b_fill),
    }
    return Decision(ranked, matches)


def _request() -> SchedRequest:
    return sched_request(CHAIN)


def test_a_prefix_is_hot_after_enough_warm_hits_in_the_window() -> None:
    heat = PrefixHeat(CONFIG)
    assert not heat.hit(7, now=0.0)
    assert heat.hit(7, now=0.5)  # 2 within 1 s
    assert not heat.hit(8, now=0.5)  # another prefix counts apart
    assert not heat.hit(9, now=0.0) and not heat.hit(9, now=1.5)  # the first hit left the window


def test_a_copy_goes_to_the_idle_cold_endpoint_once_the_prefix_is_hot() -> None:
    heat = PrefixHeat(CONFIG)
    assert choose_copy(CONFIG, heat, _request(), _decision(), 0.0, set()) is None  # 1 warm hit: not hot
    copy = choose_copy(CONFIG, heat, _request(), _decision(), 0.1, set())
    assert copy is not None and copy.endpoint.name == "b"
    assert copy.queued_prefill == _request().prompt_tokens  # b holds none of it
    # cooling down: no second copy of the same prefix...
    assert choose_copy(CONFIG, heat, _request(), _decision(), 0.2, set()) is None
    # ... until the cooldown is over (and it is hot again)
    assert choose_copy(CONFIG, heat, _request(), _decision(), 5.15, set()) is None
    assert choose_copy(CONFIG, heat, _request(), _decision(), 5.2, set()) is not None


@pytest.mark.parametrize(
    ("decision", "busy", "why"),
    [
        (_decision(a_blocks=3), set(), "the request missed: not a use of a cached prefix"),
        (_decision(b_blocks=4), set(), "the prefix is on both endpoints already"),
        (_decision(b_fill=0.9), set(), "b's cache is fuller than max_fill: a copy would evict its own"),
        (_decision(b_fill=None), set(), "b's fill is unknown"),
        (_decision(b=_endpoint("b", queued_prefill_tokens=500)), set(), "b is computing prompts"),
        (_decision(b=_endpoint("b", waiting=1)), set(), "b has requests waiting"),
        (_decision(b=_endpoint("b", pending=1)), set(), "this window placed requests on b"),
        (_decision(), {"b"}, "b has a copy in flight"),
    ],
)
def test_no_copy(decision: Decision, busy: set[str], why: str) -> None:
    heat = PrefixHeat(CONFIG)
    for now in (0.0, 0.1, 0.2):
        assert choose_copy(CONFIG, heat, _request(), decision, now, busy) is None, why


def test_the_copy_keeps_the_prompt_and_asks_one_token_without_streaming() -> None:
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 200,
        "max_completion_tokens": 200,
        "min_tokens": 50,
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": 3,
    }
    body = json.loads(copy_body(payload))
    assert body == {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "max_completion_tokens": 1,
        "stream": False,
        "n": 1,
    }


# -- end to end: a router with prewarming in front of two simulated replicas -----------------------------
def _system_prompt(rng: random.Random) -> str:
    lines = [f"Rule {i}: answer about ticket {rng.randrange(10**6)} in a calm tone." for i in range(250)]
    return " ".join(lines)


@pytest.fixture
async def sim_pool() -> AsyncIterator[SimPool]:
    async with SimPool(2, SimConfig(time_scale=0.02)) as pool:
        yield pool


async def _burst_after_warm_hits(pool: SimPool, *, prewarm: bool) -> tuple[Counter[str], list[float], float]:
    """Three requests of one tenant, one after another; then a burst of 6 of its new users at once.

    Returns where the burst went, each member's cached share of its prompt, and the copies sent."""
    yaml_text = (REPO / "config" / "cost.yaml").read_text()
    config = router_config(list(zip(pool.names, pool.urls, strict=True)), yaml_text)
    config = config.model_copy(update={"prewarm": CONFIG.model_copy(update={"enabled": prewarm})})
    system = _system_prompt(random.Random(3))

    def chat(user: int) -> dict[str, object]:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": f"I am user {user}."}]
        return {"model": MODEL, "messages": messages, "max_tokens": 2}

    async with running_router(config, rng=random.Random(7)) as router:
        async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:
            for user in range(3):
                assert (await client.post("/v1/chat/completions", json=chat(user))).status_code == 200

            async def copies() -> float:
                text = (await client.get("/metrics")).text
                return sum(metric(text, "burstsched_prewarms_total", endpoint=n) for n in pool.names)

            if prewarm:  # the copy has been answered and the pool's count of it released
                await eventually(lambda: _answered(client, pool.names))
            served: list[tuple[str, float]] = []

            async def member(user: int) -> None:
                response = await client.post("/v1/chat/completions", json=chat(user))
                assert response.status_code == 200
                usage = response.json()["usage"]
                cached = usage["prompt_tokens_details"]["cached_tokens"] / usage["prompt_tokens"]
                served.append((response.headers["x-burstsched-endpoint"], cached))

            async with anyio.create_task_group() as tg:
                for user in range(100, 106):
                    tg.start_soon(member, user)
            return Counter(name for name, _ in served), [c for _, c in served], await copies()


async def _answered(client: httpx.AsyncClient, names: list[str]) -> bool:
    text = (await client.get("/metrics")).text
    return sum(metric(text, "burstsched_prewarms_total", outcome="ok", endpoint=n) for n in names) >= 1


@pytest.mark.anyio
async def test_a_burst_on_a_prewarmed_prefix_splits_over_both_replicas_warm(sim_pool: SimPool) -> None:
    where, cached, copies = await _burst_after_warm_hits(sim_pool, prewarm=True)
    assert copies == 1  # the second warm hit made the prefix hot; the cooldown holds the rest
    assert len(where) == 2  # both replicas took members
    assert min(cached) > 0.8  # and every member found the system prompt cached


@pytest.mark.anyio
async def test_without_prewarming_the_burst_stays_on_one_replica_or_pays_a_cold_prefill(
    sim_pool: SimPool,
) -> None:
    where, cached, copies = await _burst_after_warm_hits(sim_pool, prewarm=False)
    assert copies == 0
    assert len(where) == 1 or min(cached) < 0.5


@pytest.mark.anyio
@pytest.mark.parametrize("answer", [500, None])  # an error status, and a refused connection
async def test_a_failed_copy_is_counted_and_frees_its_endpoint(answer: int | None) -> None:
    def replica(request: httpx.Request) -> httpx.Response:
        if answer is None:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(answer, json={"error": {"message": "boom"}})

    upstream = HttpxUpstream(httpx.MockTransport(replica))
    pool = EndpointPool(
        [EndpointConfig(url="http://b", name="b")], PoolConfig(), getter(upstream), clock=lambda: 0.0
    )
    metrics = RouterMetrics()
    dispatched: list[str] = []
    heat_clock = iter([0.0, 0.1])
    prewarmer = Prewarmer(
        CONFIG,
        upstream,
        pool,
        metrics,
        on_dispatch=lambda request, endpoint: dispatched.append(endpoint.name),
        clock=lambda: next(heat_clock),
    )
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    async with prewarmer:
        for _ in range(2):
            prewarmer.consider(ApiKind.CHAT, payload, _request(), _decision())
        assert prewarmer.in_flight == 1
        with anyio.fail_after(5):
            while prewarmer.in_flight:  # noqa: ASYNC110 - the copy runs in the prewarmer's own task group
                await anyio.sleep(0.01)
    assert dispatched == ["b"]
    assert metric(metrics.render().decode(), "burstsched_prewarms_total", endpoint="b", outcome="failed") == 1
    assert pool.load("b") == (0, 0)  # its prefill and in-flight count were given back
