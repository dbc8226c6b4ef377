"""The prompt cache: LRU bound, one computation per key for concurrent callers, errors and cancellation."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from burstsched.tokenization import PromptCache, TokenizationError

pytestmark = pytest.mark.anyio


def test_lru_keeps_the_most_recently_used_entries() -> None:
    cache = PromptCache(2)
    cache.put(b"a", [1, 2])
    cache.put(b"b", [3])
    assert cache.get(b"a") == (1, 2)  # a is now the most recent
    cache.put(b"c", [4])
    assert cache.get(b"b") is None
    assert cache.get(b"a") == (1, 2) and cache.get(b"c") == (4,)
    assert len(cache) == 2
    off = PromptCache(0)
    off.put(b"a", [1])
    assert off.get(b"a") is None and len(off) == 0
    with pytest.raises(ValueError, match="max_entries"):
        PromptCache(-1)


@settings(max_examples=50, deadline=None)
@given(bound=st.integers(0, 5), keys=st.lists(st.integers(0, 9), max_size=40))
def test_never_exceeds_its_bound_and_returns_what_was_stored(bound: int, keys: list[int]) -> None:
    cache = PromptCache(bound)
    for k in keys:
        cache.put(bytes([k]), [k, k + 1])
        assert len(cache) <= bound
    for k in set(keys):
        assert cache.get(bytes([k])) in (None, (k, k + 1))


async def test_concurrent_callers_share_one_computation() -> None:
    cache = PromptCache(8)
    calls = 0
    release = anyio.Event()
    results: list[tuple[int, ...]] = []

    async def compute() -> tuple[int, ...]:
        nonlocal calls
        calls += 1
        await release.wait()
        return (7, 8)

    async def ask() -> None:
        results.append(await cache.get_or_compute(b"k", compute))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(ask)
            await anyio.wait_all_tasks_blocked()
            release.set()
    assert calls == 1 and results == [(7, 8)] * 8
    assert (cache.misses, cache.hits) == (1, 7)
    assert await cache.get_or_compute(b"k", compute) == (7, 8) and calls == 1


async def test_waiters_get_the_error_and_nothing_is_stored() -> None:
    cache = PromptCache(8)
    release = anyio.Event()
    errors: list[str] = []

    async def failing() -> tuple[int, ...]:
        await release.wait()
        raise TokenizationError("template refused")

    async def ask() -> None:
        try:
            await cache.get_or_compute(b"k", failing)
        except TokenizationError as exc:
            errors.append(str(exc))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(ask)
            await anyio.wait_all_tasks_blocked()
            release.set()
    assert errors == ["template refused"] * 3
    assert cache.get(b"k") is None


async def test_a_cancelled_computation_is_taken_over_by_a_waiter() -> None:
    cache = PromptCache(8)
    first_started = anyio.Event()

    async def hangs() -> tuple[int, ...]:
        first_started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def quick() -> tuple[int, ...]:
        return (1,)

    got: list[tuple[int, ...]] = []

    async def waiter() -> None:
        got.append(await cache.get_or_compute(b"k", quick))

    leader_scope = anyio.CancelScope()

    async def leader() -> None:
        with leader_scope:
            await cache.get_or_compute(b"k", hangs)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(leader)
            await first_started.wait()
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            leader_scope.cancel()
    assert got == [(1,)]
    assert cache.get(b"k") == (1,)
