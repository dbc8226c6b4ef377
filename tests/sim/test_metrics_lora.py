"""The simulator with LoRA adapters: at most ``max_loras`` adapters run at once (a request for another waits,
as in vLLM's scheduler), and ``/metrics`` has vLLM's ``vllm:lora_requests_info``, which the router's scrape
reads back."""

from __future__ import annotations

import asyncio
import contextlib

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from burstsched.pool.scrape import parse_vllm_metrics
from burstsched.sim.clock import VirtualClock
from burstsched.sim.config import SimConfig
from burstsched.sim.cost_model import CostModel
from burstsched.sim.engine import Engine, EngineLimits, EngineRequest
from burstsched.sim.metrics import SimMetrics

from .engine_helpers import FixedTokens, tokens

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_no_lora_family_without_adapters() -> None:
    page = SimMetrics(SimConfig()).render(num_running=0, num_waiting=0, kv_cache_usage=0.0)
    assert b"vllm:lora_requests_info" not in page


async def test_a_second_adapter_waits_past_max_loras_and_metrics_say_so() -> None:
    config = SimConfig(lora_modules=("sql-lora", "tweet-lora"), max_loras=1)
    metrics = SimMetrics(config)
    limits = EngineLimits(
        block_size=4,
        num_gpu_blocks=64,
        max_num_seqs=16,
        max_num_batched_tokens=64,
        max_loras=config.max_loras,
    )
    engine = Engine(limits, CostModel(), clock=VirtualClock(), stats=metrics)
    sql = EngineRequest("a", tokens(0, 8), 3, FixedTokens(), lora_name="sql-lora")
    tweet = EngineRequest("b", tokens(100, 8), 3, FixedTokens(), lora_name="tweet-lora")
    base = EngineRequest("c", tokens(200, 8), 3, FixedTokens())
    for req in (sql, tweet, base):
        engine.add_request(req)
    task = asyncio.create_task(engine.run())
    try:
        with anyio.fail_after(10):
            await sql.events.get()  # the first step ran: sql-lora and the base model, tweet-lora waits
        assert tweet.scheduled_time is None and base.scheduled_time is not None
        page = metrics.render(num_running=2, num_waiting=1, kv_cache_usage=0.1).decode()
        (family,) = [f for f in text_string_to_metric_families(page) if f.name == "vllm:lora_requests_info"]
        latest = max(family.samples, key=lambda s: s.value)
        assert latest.labels == {
            "max_lora": "1",
            "running_lora_adapters": "sql-lora",
            "waiting_lora_adapters": "tweet-lora",
        }
        scraped = parse_vllm_metrics(page)
        assert scraped.running_adapters == {"sql-lora"} and scraped.waiting_adapters == {"tweet-lora"}
        assert scraped.max_adapters == 1
        with anyio.fail_after(10):
            while (await tweet.events.get()).finish_reason is None:
                pass
        assert tweet.scheduled_time is not None and sql.finished_time is not None
        assert tweet.scheduled_time >= sql.finished_time  # it ran once sql-lora's request was over
        done = parse_vllm_metrics(metrics.render(num_running=0, num_waiting=0, kv_cache_usage=0.0).decode())
        assert (done.running_adapters, done.waiting_adapters) == (frozenset(), frozenset())
    finally:
        engine.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
