"""The prefix cache alone: hashing, hits, LRU eviction over unheld blocks, capacity, events."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from burstsched.prefix.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from burstsched.sim.block_cache import BlockCache, BlockHasher


def _store(cache: BlockCache, hasher: BlockHasher, tokens: list[int]) -> list[int]:
    """Allocate and cache the full blocks of ``tokens`` as one request would; returns its block ids."""
    hashes: list[int] = []
    hasher.extend(hashes, tokens)
    ids = cache.allocate(len(hashes))
    cache.cache_blocks(ids, hashes, tokens[: len(hashes) * cache.block_size], None)
    return ids


def test_block_hashes_chain_and_depend_on_every_earlier_token() -> None:
    hasher = BlockHasher(4)
    a: list[int] = []
    b: list[int] = []
    hasher.extend(a, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    hasher.extend(b, [1, 2, 3, 0, 5, 6, 7, 8])
    assert len(a) == 2 and len(b) == 2
    assert a[0] != b[0] and a[1] != b[1]
    assert all(0 <= h < 2**64 for h in a)
    assert a[1] == hasher.hash_block(a[0], [5, 6, 7, 8])
    assert BlockHasher(4, seed=1).hash_block(None, [1, 2, 3, 4]) != a[0]


def test_hit_is_the_longest_cached_prefix_in_whole_blocks() -> None:
    cache = BlockCache(16, 4)
    hasher = BlockHasher(4)
    _store(cache, hasher, list(range(12)))
    probe: list[int] = []
    hasher.extend(probe, [*range(8), 99, 99, 99, 99])
    assert len(cache.longest_hit(probe, max_tokens=100)) == 2
    assert len(cache.longest_hit(probe, max_tokens=7)) == 1


def test_eviction_is_lru_over_unheld_blocks() -> None:
    cache = BlockCache(7, 2)  # 6 usable blocks
    hasher = BlockHasher(2)
    old = _store(cache, hasher, [1, 1, 2, 2])
    new = _store(cache, hasher, [3, 3, 4, 4])
    held = _store(cache, hasher, [5, 5, 6, 6])
    cache.free(reversed(old))
    cache.free(reversed(new))
    cache.take_events()
    got = cache.allocate(3)
    # The least recently freed blocks go first, each request's tail before its head; held ones never.
    assert got == [old[1], old[0], new[1]]
    assert not set(got) & set(held)
    removed = [e for e in cache.take_events() if isinstance(e, BlockRemoved)]
    assert len(removed) == 3
    assert cache.num_cached_blocks == 3


def test_freed_blocks_without_a_hash_are_reused_first_and_last_freed_first() -> None:
    """vLLM 0.32's ``BlockPool.free_blocks``: uncached blocks go to the free queue's head (LIFO), so a
    prompt's last, partial block never pushes a cached block out of the LRU order."""
    cache = BlockCache(9, 2)  # 8 usable blocks
    hasher = BlockHasher(2)
    first = _store(cache, hasher, [1, 1, 2, 2])
    first_partial = cache.allocate(1)  # the prompt's last token and the output: no full block
    second = _store(cache, hasher, [3, 3, 4, 4])
    second_partial = cache.allocate(1)
    never_used = cache.free_queue()  # the two blocks no request has had yet
    cache.free(reversed(first + first_partial))
    cache.free(reversed(second + second_partial))
    cache.take_events()
    assert cache.free_queue()[:2] == [*second_partial, *first_partial]
    assert cache.allocate(2) == [*second_partial, *first_partial]
    assert cache.take_events() == []  # nothing cached was evicted
    # Then the blocks never used, then the cached ones: least recently freed first, tail before head.
    assert len(never_used) == 2
    assert cache.free_queue() == [*never_used, first[1], first[0], second[1], second[0]]


def test_touching_a_cached_block_protects_it_from_eviction() -> None:
    cache = BlockCache(5, 2)
    hasher = BlockHasher(2)
    first = _store(cache, hasher, [1, 1, 2, 2])
    cache.free(reversed(first))
    cache.touch([first[0]])
    got = cache.allocate(3)
    assert first[0] not in got
    assert cache.block_hash(first[0]) is not None


def test_reset_is_refused_while_held_and_clears_otherwise() -> None:
    cache = BlockCache(8, 2)
    hasher = BlockHasher(2)
    ids = _store(cache, hasher, [1, 2, 3, 4])
    assert cache.reset() is False
    cache.free(reversed(ids))
    cache.take_events()
    assert cache.reset() is True
    assert cache.num_cached_blocks == 0
    assert cache.take_events() == [AllBlocksCleared()]


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["store", "free", "reset"]), st.integers(0, 5), st.integers(1, 6)),
        max_size=40,
    ),
    num_blocks=st.integers(3, 20),
)
def test_capacity_refcounts_and_events_stay_consistent(
    ops: list[tuple[str, int, int]], num_blocks: int
) -> None:
    cache = BlockCache(num_blocks, 2)
    hasher = BlockHasher(2)
    holders: list[list[int]] = []
    mirror: dict[int, int] = {}  # hash -> number of blocks carrying it, rebuilt from events only
    for op, family, n in ops:
        if op == "store":
            hashes: list[int] = []
            toks = [family] * (2 * n)
            hasher.extend(hashes, toks)
            hits = cache.longest_hit(hashes, len(toks))
            new = len(hashes) - len(hits)
            if cache.can_allocate(new, hits):
                cache.touch(hits)
                ids = hits + cache.allocate(new)
                start = len(hits)
                cache.cache_blocks(
                    ids[start:], hashes[start:], toks[start * 2 :], hashes[start - 1] if start else None
                )
                holders.append(ids)
        elif op == "free" and holders:
            cache.free(reversed(holders.pop(family % len(holders))))
        elif op == "reset":
            cache.reset()
        for event in cache.take_events():
            if isinstance(event, BlockStored):
                for h in event.block_hashes:
                    mirror[h] = mirror.get(h, 0) + 1
                assert len(event.token_ids) == len(event.block_hashes) * 2
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    mirror[h] -= 1
                    if not mirror[h]:
                        del mirror[h]
            elif isinstance(event, AllBlocksCleared):
                mirror.clear()
        held = {b for ids in holders for b in ids}
        assert cache.num_held_blocks == len(held) <= num_blocks - 1
        assert cache.num_free_blocks + cache.num_held_blocks == num_blocks - 1
        assert all(cache.ref_count(b) == sum(ids.count(b) for ids in holders) for b in held)
        assert set(mirror) == cache.cached_hashes()
        assert sum(mirror.values()) == cache.num_cached_blocks <= num_blocks - 1
