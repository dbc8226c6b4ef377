"""The cost model's step: linear in its work, and on a CPU replica slower for every sequence it serves;
a /metrics render holds the API server's loop and the engine's core."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from collections.abc import Awaitable

import httpx
import pytest

from burstsched.admission.clock import LoopClock
from burstsched.replay.virtual_time import run_virtual
from burstsched.sim.config import SimConfig
from burstsched.sim.cost_model import CostModel, Jitter
from burstsched.sim.inprocess import InProcessReplica

from .engine_helpers import running_engine, tokens, wait_until

COST = CostModel(step_overhead_s=0.01, prefill_s_per_token=0.001, decode_s_per_seq=0.002)


def test_a_step_is_its_overhead_prefill_and_decodes() -> None:
    assert COST.step_s(0, 0) == 0.0
    assert COST.step_s(100, 3) == pytest.approx(0.01 + 0.1 + 0.006)


def test_a_load_slowdown_lengthens_a_step_by_each_sequence_beyond_the_first() -> None:
    slow = CostModel(
        step_overhead_s=0.01, prefill_s_per_token=0.001, decode_s_per_seq=0.002, load_slowdown=0.5
    )
    assert slow.step_s(100, 0, sequences=1) == pytest.approx(COST.step_s(100, 0))
    assert slow.step_s(100, 3, sequences=4) == pytest.approx(COST.step_s(100, 3) * 2.5)
    with pytest.raises(ValueError):
        CostModel(load_slowdown=-0.1)


def test_the_front_end_slows_with_the_requests_the_engine_holds_as_a_step_does() -> None:
    """A CPU replica's API server shares the cores with its engine: ``busy`` requests in the engine make
    the front end's work 1 + slowdown x busy times longer; on a GPU (no slowdown) it stays the same."""
    slow = CostModel(frontend_s_per_prompt_token=1e-5, load_slowdown=0.5)
    assert slow.frontend_s(1000) == pytest.approx(0.01)
    assert slow.frontend_s(1000, busy=3) == pytest.approx(0.01 * 2.5)
    assert COST.frontend_s(1000, busy=3) == pytest.approx(COST.frontend_s(1000))


@pytest.mark.anyio
async def test_two_decoding_sequences_each_wait_longer_per_token_with_a_slowdown() -> None:
    """Two requests decode side by side: each step costs its overhead, with a 0.5 slowdown half again."""
    gaps: dict[float, float] = {}
    for slowdown in (0.0, 0.5):
        cost = CostModel(
            step_overhead_s=0.01, prefill_s_per_token=0.0, decode_s_per_seq=0.0, load_slowdown=slowdown
        )
        async with running_engine(block_size=4, max_num_batched_tokens=64, cost=cost) as h:
            a, b = h.request("a", tokens(1, 8), max_tokens=6), h.request("b", tokens(50, 8), max_tokens=6)
            h.add(a)
            h.add(b)
            await h.finish(a)
            await h.finish(b)
            assert a.first_token_time is not None and a.finished_time is not None
            gaps[slowdown] = (a.finished_time - a.first_token_time) / 5
    assert gaps[0.0] == pytest.approx(0.01)
    assert gaps[0.5] == pytest.approx(0.015)


def test_jitter_draws_median_one_factors_of_its_spread_and_none_without_it() -> None:
    rng = random.Random(3)
    state = rng.getstate()
    assert all(Jitter(0.0, rng).factor() == 1.0 for _ in range(10))
    assert rng.getstate() == state  # no spread, no draw: a replay without jitter is unchanged
    logs = [math.log(Jitter(0.4, rng).factor()) for _ in range(4000)]
    assert statistics.median(logs) == pytest.approx(0.0, abs=0.03)
    assert statistics.stdev(logs) == pytest.approx(0.4, abs=0.02)
    first, again = Jitter(0.4, random.Random("r0")), Jitter(0.4, random.Random("r0"))
    assert [first.factor() for _ in range(5)] == [again.factor() for _ in range(5)]
    with pytest.raises(ValueError, match="jitter"):
        CostModel(jitter=-0.1)


@pytest.mark.anyio
async def test_a_render_during_a_step_lengthens_it_and_one_while_idle_costs_nothing() -> None:
    """``Engine.steal``: a /metrics render on the engine's core pushes the step in progress back by its
    length; the engine loses nothing to a render while it has no step."""
    cost = CostModel(step_overhead_s=0.01, prefill_s_per_token=0.0, decode_s_per_seq=0.0)
    finished: dict[bool, float] = {}
    for stolen in (False, True):
        async with running_engine(block_size=4, max_num_batched_tokens=64, cost=cost) as h:
            h.engine.steal(0.5)  # idle
            a = h.request("a", tokens(1, 8), max_tokens=4)
            start = h.clock.now()
            h.add(a)
            if stolen:
                await wait_until(lambda a=a: a.first_token_time is not None)  # type: ignore[misc]
                h.engine.steal(0.003)  # during the second step
            await h.finish(a)
            assert a.finished_time is not None
            finished[stolen] = a.finished_time - start
    assert finished[False] == pytest.approx(0.04)  # four steps of 10 ms
    assert finished[True] == pytest.approx(0.043)


def _served_after_a_scrape(render_s: float) -> tuple[float, float]:
    """On virtual time: a replica's /metrics is fetched, and a chat request arrives 1 ms into the fetch;
    (the scrape's duration, the request's) in seconds."""
    config = SimConfig(
        cost=CostModel(frontend_s_per_prompt_token=1e-5, metrics_render_s=render_s),
        kv_events_endpoint=None,
    )

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        async with InProcessReplica(config, name="r0", clock=LoopClock()) as replica:
            transport = httpx.ASGITransport(app=replica.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://r0") as http:

                async def timed(coro: Awaitable[httpx.Response]) -> float:
                    start = loop.time()
                    (await coro).raise_for_status()
                    return loop.time() - start

                scrape = asyncio.create_task(timed(http.get("/metrics")))
                await asyncio.sleep(0.001)
                body = {"model": config.served_model_name, "prompt": "one two three", "max_tokens": 2}
                request = await timed(http.post("/v1/completions", json=body))
                return await scrape, request

    return run_virtual(main)


def test_a_metrics_render_holds_the_api_loop_and_slows_a_request_arriving_meanwhile() -> None:
    scrape_free, request_free = _served_after_a_scrape(0.0)
    scrape, request = _served_after_a_scrape(0.05)
    assert scrape_free == pytest.approx(0.0, abs=1e-6) and scrape == pytest.approx(0.05, abs=1e-6)
    # the request's front end ends when the loop is free, 49 ms after it came (the engine was idle)
    assert request - request_free == pytest.approx(0.049, abs=0.002)
    with pytest.raises(ValueError, match="metrics_render_s"):
        CostModel(metrics_render_s=-0.001)
