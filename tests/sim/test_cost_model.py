"""The cost model's step: linear in its work, and on a CPU replica slower for every sequence it serves."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from burstsched.sim.cost_model import CostModel, Jitter

from .engine_helpers import running_engine, tokens

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
