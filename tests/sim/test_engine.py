"""The engine's scheduling and prefix-cache behaviour, on a virtual clock (counts and orders only)."""

from __future__ import annotations

from typing import Literal

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from burstsched.prefix.kv_events import AllBlocksCleared, BlockStored
from burstsched.sim.engine import QueueFullError, Status

from .engine_helpers import running_engine, tokens, wait_until

pytestmark = pytest.mark.anyio


async def test_warm_request_hits_the_shared_full_blocks() -> None:
    async with running_engine(block_size=4) as h:
        first = h.request("a", tokens(100, 22))
        h.add(first)
        await h.finish(first)
        # Shares the first 22 tokens: 5 full blocks (20 tokens); the partial 6th block is not reused.
        second = h.request("b", tokens(100, 22) + [9, 9, 9])
        h.add(second)
        await h.finish(second)
        assert second.num_cached_tokens == 20
        assert second.prefill_computed_tokens == 5
        assert h.stats.hits == 20
        assert h.stats.queries == 22 + 25


async def test_a_fully_cached_prompt_still_recomputes_its_last_block() -> None:
    async with running_engine(block_size=4) as h:
        first = h.request("a", tokens(100, 16))
        h.add(first)
        await h.finish(first)
        again = h.request("b", tokens(100, 16))
        h.add(again)
        await h.finish(again)
        # The hit is capped at prompt_len - 1 = 15 tokens, rounded down to whole blocks: 12.
        assert again.num_cached_tokens == 12
        assert again.prefill_computed_tokens == 4


async def test_concurrent_identical_prefix_is_computed_once() -> None:
    async with running_engine(block_size=4, max_num_batched_tokens=256) as h:
        prefix = tokens(1000, 100)
        burst = [h.request(f"r{i}", prefix + [i, i, i]) for i in range(8)]
        h.add(*burst)
        await h.finish(*burst)
        computed = sum(r.prefill_computed_tokens for r in burst)
        # One request computes the prefix and its tail; the others only their own last block.
        assert computed == 103 + 7 * 3
        assert all(r.num_cached_tokens == 100 for r in burst[1:])
        first_token_times = {r.first_token_time for r in burst}
        assert len(first_token_times) == 1


async def test_later_requests_wait_for_blocks_being_computed_by_chunked_prefill() -> None:
    async with running_engine(block_size=4, max_num_batched_tokens=40, num_gpu_blocks=128) as h:
        prefix = tokens(1000, 120)
        lead = h.request("lead", prefix + [1])
        h.add(lead)
        await anyio.lowlevel.checkpoint()
        follower = h.request("follow", prefix + [2])
        h.add(follower)
        await h.finish(lead, follower)
        # The follower arrived while the lead was prefilling in 40-token chunks; it finds every block
        # the lead had scheduled by then and computes far less than the prefix.
        assert follower.num_cached_tokens >= 40
        assert lead.prefill_computed_tokens + follower.prefill_computed_tokens < 2 * 121
        assert max(h.stats.step_tokens) <= 40


async def test_budget_and_max_num_seqs_bound_each_step() -> None:
    async with running_engine(block_size=4, max_num_batched_tokens=10, max_num_seqs=2) as h:
        reqs = [h.request(f"r{i}", tokens(100 * i, 7), max_tokens=3) for i in range(1, 5)]
        h.add(*reqs)
        await anyio.lowlevel.checkpoint()
        assert h.engine.num_running <= 2
        await h.finish(*reqs)
        assert all(t <= 10 for t in h.stats.step_tokens)
        assert sorted(h.stats.finished_ids) == ["r1", "r2", "r3", "r4"]


async def test_requests_finish_with_exactly_max_tokens_and_free_their_blocks() -> None:
    async with running_engine() as h:
        req = h.request("a", tokens(1, 9), max_tokens=5)
        h.add(req)
        await h.finish(req)
        assert len(req.output_token_ids) == 5
        assert req.finish_reason == "length"
        assert req.status is Status.FINISHED
        assert h.engine.cache.num_held_blocks == 0
        assert h.engine.kv_cache_usage == 0.0


async def test_abort_frees_blocks_and_leaves_the_running_set() -> None:
    async with running_engine(block_size=4) as h:
        req = h.request("a", tokens(1, 30), max_tokens=10_000)
        h.add(req)
        await wait_until(lambda: bool(req.output_token_ids))
        assert h.engine.num_running == 1
        assert h.engine.cache.num_held_blocks > 0
        h.engine.abort("a")
        await wait_until(lambda: h.engine.num_running == 0)
        assert req.finish_reason == "abort"
        assert h.engine.cache.num_held_blocks == 0
        assert "a" not in h.stats.finished_ids


async def test_waiting_queue_limit_raises_queue_full() -> None:
    async with running_engine(max_num_seqs=1, max_waiting_requests=2) as h:
        h.add(h.request("running", tokens(1, 5), max_tokens=1000))
        await anyio.lowlevel.checkpoint()
        h.add(h.request("w1", tokens(10, 5)), h.request("w2", tokens(20, 5)))
        with pytest.raises(QueueFullError):
            h.add(h.request("w3", tokens(30, 5)))
        assert h.engine.num_waiting == 2


async def test_cache_pressure_preempts_the_newest_running_request() -> None:
    # 9 usable blocks of 4 tokens; two requests each growing past 5 blocks cannot both stay.
    async with running_engine(block_size=4, num_gpu_blocks=10, max_num_batched_tokens=64) as h:
        a = h.request("a", tokens(100, 12), max_tokens=12)
        b = h.request("b", tokens(200, 12), max_tokens=12)
        h.add(a, b)
        await h.finish(a, b)
        assert h.stats.preemptions >= 1
        assert b.num_preemptions >= 1
        assert a.num_preemptions == 0
        assert len(a.output_token_ids) == len(b.output_token_ids) == 12


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("priority", ["running", "early-1", "early-2", "late"]),
        ("fcfs", ["running", "late", "early-1", "early-2"]),
    ],
)
async def test_priority_policy_serves_lower_priority_values_first_fcfs_ignores_them(
    policy: Literal["fcfs", "priority"], expected: list[str]
) -> None:
    """vLLM's --scheduling-policy priority: one sequence at a time; while "running" holds it, "late" (priority
    9), then "early-1" and "early-2" (priority -1) arrive. Under the priority policy the -1s go first, in
    arrival order; under FCFS the field is ignored."""
    async with running_engine(max_num_seqs=1, scheduling_policy=policy) as h:
        running = h.request("running", tokens(1, 5), max_tokens=8)
        h.add(running)
        await wait_until(lambda: bool(running.output_token_ids))
        late = h.request("late", tokens(100, 5), priority=9)
        h.add(late)
        await anyio.lowlevel.checkpoint()
        early = [h.request(f"early-{i}", tokens(200 * i, 5), priority=-1) for i in (1, 2)]
        h.add(*early)
        await h.finish(running, late, *early)
        assert h.stats.finished_ids == expected


async def test_priority_policy_preempts_the_least_urgent_running_request() -> None:
    """Under cache pressure the priority policy preempts the running request with the largest (priority,
    arrival): the older "a" here, where FCFS would preempt the newest, "b"."""
    async with running_engine(
        block_size=4, num_gpu_blocks=10, max_num_batched_tokens=64, scheduling_policy="priority"
    ) as h:
        a = h.request("a", tokens(100, 12), max_tokens=12, priority=5)
        b = h.request("b", tokens(200, 12), max_tokens=12, priority=0)
        h.add(a, b)
        await h.finish(a, b)
        assert a.num_preemptions >= 1 and b.num_preemptions == 0
        assert len(a.output_token_ids) == len(b.output_token_ids) == 12


async def test_reset_is_refused_while_blocks_are_held_unless_running_requests_are_reset() -> None:
    async with running_engine(block_size=4) as h:
        req = h.request("a", tokens(1, 12), max_tokens=10_000)
        h.add(req)
        await wait_until(lambda: bool(req.output_token_ids))
        assert await h.engine.reset_prefix_cache() is False
        assert await h.engine.reset_prefix_cache(reset_running_requests=True) is True
        h.engine.abort("a")


async def test_a_reset_is_published_with_the_next_step_not_while_idle() -> None:
    """vLLM's engine core runs no step while idle: a reset's AllBlocksCleared (one per successful reset)
    goes out with the next request's first step, ahead of that step's own events."""
    async with running_engine(block_size=4) as h:
        a = h.request("a", tokens(1, 9), max_tokens=2)
        h.add(a)
        await h.finish(a)
        before = len(h.events)
        assert await h.engine.reset_prefix_cache() is True
        assert await h.engine.reset_prefix_cache() is True
        for _ in range(10):  # let the idle engine run whatever it would
            await anyio.lowlevel.checkpoint()
        assert h.events[before:] == []
        b = h.request("b", tokens(50, 9), max_tokens=1)
        h.add(b)
        await h.finish(b)
        after = h.events[before:]
        assert after[:2] == [AllBlocksCleared(), AllBlocksCleared()]
        stored = [e for e in after[2:] if isinstance(e, BlockStored)]
        assert [t for e in stored for t in e.token_ids] == tokens(50, 8)
        assert len(after) == 2 + len(stored)


async def test_a_refused_reset_queues_no_event() -> None:
    async with running_engine(block_size=4) as h:
        req = h.request("a", tokens(1, 12), max_tokens=10_000)
        h.add(req)
        await wait_until(lambda: bool(req.output_token_ids))
        assert await h.engine.reset_prefix_cache() is False
        h.engine.abort("a")
        b = h.request("b", tokens(50, 3), max_tokens=2)
        h.add(b)
        await h.finish(b)
        assert AllBlocksCleared() not in h.events


async def test_cache_creation_tokens_are_the_full_blocks_less_the_hits() -> None:
    """vLLM's ``created_cache_tokens``: at the first token, prompt tokens in the request's cached full blocks
    less its hits. A fully cached prompt recomputes (and caches again) its last block."""
    async with running_engine(block_size=4) as h:
        cold = h.request("cold", tokens(1, 10))
        h.add(cold)
        await h.finish(cold)
        warm = h.request("warm", tokens(1, 10))
        h.add(warm)
        await h.finish(warm)
        exact = h.request("exact", tokens(100, 12))
        h.add(exact)
        await h.finish(exact)
        exact_again = h.request("exact-again", tokens(100, 12))
        h.add(exact_again)
        await h.finish(exact_again)
    assert (cold.num_cached_tokens, cold.num_cache_creation_tokens) == (0, 8)
    assert (warm.num_cached_tokens, warm.num_cache_creation_tokens) == (8, 0)
    assert (exact.num_cached_tokens, exact.num_cache_creation_tokens) == (0, 12)
    assert (exact_again.num_cached_tokens, exact_again.num_cache_creation_tokens) == (8, 4)


async def test_no_prefix_caching_means_no_hits() -> None:
    async with running_engine(enable_prefix_caching=False) as h:
        a = h.request("a", tokens(1, 20))
        h.add(a)
        await h.finish(a)
        b = h.request("b", tokens(1, 20))
        h.add(b)
        await h.finish(b)
        assert b.num_cached_tokens == 0
        assert b.num_cache_creation_tokens == 0
        assert h.stats.hits == 0
        assert h.events == []


async def test_cache_salt_separates_identical_prompts() -> None:
    async with running_engine(block_size=4) as h:
        a = h.request("a", tokens(1, 20), salt="tenant-a")
        h.add(a)
        await h.finish(a)
        b = h.request("b", tokens(1, 20), salt="tenant-b")
        h.add(b)
        await h.finish(b)
        c = h.request("c", tokens(1, 20), salt="tenant-a")
        h.add(c)
        await h.finish(c)
        assert b.num_cached_tokens == 0
        assert c.num_cached_tokens == 16


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompts=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(1, 6)), min_size=1, max_size=12
    ),
    blocks=st.integers(12, 40),
    budget=st.integers(8, 64),
)
def test_engine_invariants_hold_for_any_workload(
    prompts: list[tuple[int, int, int]], blocks: int, budget: int
) -> None:
    """Requests from a few shared prefixes: all finish, usage never exceeds capacity, blocks all return."""

    async def scenario() -> None:
        async with running_engine(
            block_size=4, num_gpu_blocks=blocks, max_num_batched_tokens=budget, max_num_seqs=4
        ) as h:
            reqs = []
            for i, (family, length, out) in enumerate(prompts):
                prompt = tokens(10_000 * (family + 1), min(length, (blocks - 1) * 4 - out))
                reqs.append(h.request(f"r{i}", prompt, max_tokens=out))
            h.add(*reqs)
            with anyio.fail_after(10):
                while any(r.status is not Status.FINISHED for r in reqs):
                    assert h.engine.cache.num_held_blocks <= blocks - 1
                    assert 0.0 <= h.engine.kv_cache_usage <= 1.0
                    await anyio.lowlevel.checkpoint()
            assert all(len(r.output_token_ids) == r.max_tokens for r in reqs)
            assert h.engine.cache.num_held_blocks == 0
            assert h.stats.hits <= h.stats.queries

    anyio.run(scenario)
