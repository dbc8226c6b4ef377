"""Engine tokens per router token, learned per replica; the approximate index sized by them."""

from __future__ import annotations

import random

import httpx
import pytest
from burstsched_plugins.approx_prefix import ApproxPrefixParameters, ApproxPrefixProducer

from burstsched.config import EndpointConfig, PoolConfig
from burstsched.dispatch import HttpxUpstream, getter
from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, PrefixMatch
from burstsched.pool import EndpointPool, parse_vllm_metrics

from .helpers import sched_request

PAGE = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="tiny"}} 0.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="tiny"}} 0.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="128",engine="0",num_gpu_blocks="100"}} 1.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{{engine="0",model_name="tiny"}} {engine0}
vllm:prompt_tokens_total{{engine="1",model_name="tiny"}} {engine1}
vllm:prompt_tokens_created{{engine="0",model_name="tiny"}} 1.7e9
# TYPE vllm:prompt_tokens_cached counter
vllm:prompt_tokens_cached_total{{engine="0",model_name="tiny"}} 99999.0
"""


def test_the_prompt_token_counter_is_summed_over_engines_and_nothing_else_is_taken_for_it() -> None:
    assert parse_vllm_metrics(PAGE.format(engine0=1000.0, engine1=500.0)).prompt_tokens == 1500.0
    no_counter = "\n".join(line for line in PAGE.splitlines() if "prompt_tokens_total" not in line)
    assert parse_vllm_metrics(no_counter.format(engine0=0, engine1=0)).prompt_tokens is None


class _Replica:
    def __init__(self) -> None:
        self.counted = 0.0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=PAGE.format(engine0=self.counted, engine1=0.0))
        return httpx.Response(200, json={"object": "list", "data": [{"id": "tiny", "object": "model"}]})


@pytest.mark.anyio
async def test_the_pool_learns_engine_tokens_per_router_token_from_the_replica_s_counter() -> None:
    replica = _Replica()
    replica.counted = 50_000.0  # before the router sent anything: the baseline
    fetch = getter(HttpxUpstream(httpx.MockTransport(replica)))
    pool = EndpointPool(
        [EndpointConfig(url="http://r1:8000", name="r1")], PoolConfig(), fetch, clock=lambda: 1.0
    )
    await pool.refresh()
    assert pool.snapshot("r1").engine_tokens_per_prompt_token is None
    for _ in range(10):  # 10 requests of 3000 router tokens: under the minimum, not trusted yet
        pool.acquire("r1", 0, 3000)
    replica.counted += 10 * 5700
    await pool.scrape("r1")
    assert pool.snapshot("r1").engine_tokens_per_prompt_token is None
    for _ in range(10):
        pool.acquire("r1", 0, 3000)
    replica.counted += 10 * 5700
    await pool.scrape("r1")
    assert pool.snapshot("r1").engine_tokens_per_prompt_token == pytest.approx(1.9)
    replica.counted = 100.0  # the replica restarted: its counter went back, the count starts over
    await pool.scrape("r1")
    pool.acquire("r1", 0, 40_000)
    replica.counted += 20_000
    await pool.scrape("r1")
    assert pool.snapshot("r1").engine_tokens_per_prompt_token == pytest.approx(0.5)


def _endpoint(ratio: float | None) -> EndpointSnapshot:
    return EndpointSnapshot(
        "r1", "http://r1", block_size=128, num_gpu_blocks=100, engine_tokens_per_prompt_token=ratio
    )


def test_capacity_in_router_blocks_divides_by_the_learned_ratio() -> None:
    assert _endpoint(None).capacity_blocks(64) == 200  # 12800 tokens, one engine token a router token
    assert _endpoint(2.0).capacity_blocks(64) == 100
    assert _endpoint(2.0).capacity_blocks(64, learned=False) == 200  # the producer's engine_tokens: false
    assert EndpointSnapshot("r", "http://r").capacity_blocks(64) is None


def test_the_approximate_index_forgets_what_a_cache_of_the_learned_size_no_longer_holds() -> None:
    """Six prompts of 20 blocks sent to one replica whose cache holds 12800 engine tokens: counted one engine
    token a router token (200 blocks) the index believes all six cached; at 2 engine tokens a router token
    (100 blocks) the first ones are gone, as they are from the replica's cache (unless the producer is told
    to count one engine token a router token)."""
    rng = random.Random(1)
    prompts = [[rng.getrandbits(64) for _ in range(20)] for _ in range(6)]
    cases = ((None, True, True), (2.0, True, False), (2.0, False, True))
    for ratio, engine_tokens, first_cached in cases:
        parameters = ApproxPrefixParameters(engine_tokens=engine_tokens)
        producer = ApproxPrefixProducer("p", parameters, PluginContext(rng=random.Random(0)))
        endpoint = _endpoint(ratio)
        for hashes in prompts:
            producer.on_dispatch(sched_request(hashes), endpoint)
        oldest, newest = CycleState(), CycleState()
        producer.produce(sched_request(prompts[0]), [endpoint], oldest)
        producer.produce(sched_request(prompts[-1]), [endpoint], newest)
        first, last = oldest.get("r1", PrefixMatch), newest.get("r1", PrefixMatch)
        assert first is not None and last is not None
        assert (first.matched_blocks == 20) is first_cached, ratio
        assert last.matched_blocks == 20
