"""The pool's prefill ledger and the prefill speed it learns from each replica's metrics."""

from __future__ import annotations

import httpx
import pytest

from burstsched.config import EndpointConfig, PoolConfig
from burstsched.dispatch import HttpxUpstream, getter
from burstsched.pool import EndpointPool

pytestmark = pytest.mark.anyio


class Pages:
    """What the replica's /metrics says next (an in-process fake replica for the pool's client)."""

    def __init__(self) -> None:
        self.tokens = 0.0
        self.seconds = 0.0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            page = (
                'vllm:num_requests_waiting{model_name="m"} 0\n'
                'vllm:num_requests_running{model_name="m"} 0\n'
                f'vllm:request_prefill_kv_computed_tokens_sum{{model_name="m"}} {self.tokens}\n'
                f'vllm:request_prefill_time_seconds_sum{{model_name="m"}} {self.seconds}\n'
            )
            return httpx.Response(200, text=page)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        return httpx.Response(200, json={})


async def test_queued_prefill_counts_until_the_first_token_or_the_end() -> None:
    fetch = getter(HttpxUpstream(httpx.MockTransport(Pages())))
    pool = EndpointPool([EndpointConfig(url="http://a:1", name="a")], PoolConfig(), fetch, clock=lambda: 0.0)
    pool.acquire("a", 3000)
    pool.acquire("a", 500)
    assert pool.snapshot("a").queued_prefill_tokens == 3500 and pool.snapshot("a").in_flight == 2
    pool.prefill_done("a", 3000)
    pool.release("a", 0)
    assert pool.snapshot("a").queued_prefill_tokens == 500 and pool.snapshot("a").in_flight == 1
    pool.release("a", 500)  # ended (failed, or non-streamed) before any first token was seen
    assert pool.snapshot("a").queued_prefill_tokens == 0 and pool.snapshot("a").in_flight == 0


async def test_the_prefill_speed_is_learned_from_the_counters_growth() -> None:
    pages = Pages()
    fetch = getter(HttpxUpstream(httpx.MockTransport(pages)))
    pool = EndpointPool([EndpointConfig(url="http://a:1", name="a")], PoolConfig(), fetch, clock=lambda: 0.0)
    await pool.scrape("a")
    assert pool.snapshot("a").prefill_tokens_per_s is None
    pages.tokens, pages.seconds = 4000.0, 1.0
    await pool.scrape("a")
    assert pool.snapshot("a").prefill_tokens_per_s == pytest.approx(4000.0)
    pages.tokens, pages.seconds = 4100.0, 1.01  # too little prefill time to count: kept for later
    await pool.scrape("a")
    assert pool.snapshot("a").prefill_tokens_per_s == pytest.approx(4000.0)
    pages.tokens, pages.seconds = 6000.0, 2.0  # 2000 tokens in 1 s since the last counted sample
    await pool.scrape("a")
    assert pool.snapshot("a").prefill_tokens_per_s == pytest.approx(
        4000 + 0.3 * (2000 / 1.0 - 4000), rel=0.01
    )
    pages.tokens, pages.seconds = 10.0, 0.01  # the replica restarted: its counters start over
    await pool.scrape("a")
    pages.tokens, pages.seconds = 1010.0, 1.01
    await pool.scrape("a")
    assert pool.snapshot("a").prefill_tokens_per_s is not None


async def test_the_prefill_demand_is_what_was_sent_to_compute_per_second_lately() -> None:
    now = [0.0]
    fetch = getter(HttpxUpstream(httpx.MockTransport(Pages())))
    pool = EndpointPool(
        [EndpointConfig(url="http://a:1", name="a"), EndpointConfig(url="http://b:1", name="b")],
        PoolConfig(),
        fetch,
        clock=lambda: now[0],
    )
    for _ in range(600):  # 2 requests of 1000 tokens to compute per second to a, for 5 time constants
        now[0] += 0.5
        pool.acquire("a", 1000, 1200)
        pool.acquire("b", 0, 1200)  # a warm hit with nothing to compute adds no demand
    assert pool.prefill_demands()["a"] == pytest.approx(2000.0, rel=0.03)
    assert pool.prefill_demands()["b"] == 0.0
    now[0] += 10.0  # one time constant with nothing sent
    assert pool.prefill_demands()["a"] == pytest.approx(2000.0 / 2.718, rel=0.03)
