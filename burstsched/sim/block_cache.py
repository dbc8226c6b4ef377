"""The prefix cache of one replica, with vLLM v1's semantics (``BlockPool`` and ``KVCacheManager``).

- ``num_gpu_blocks`` blocks; block 0 is the null block vLLM reserves, so ``num_gpu_blocks - 1`` are usable.
- Only full blocks are cached. Block ``i`` of a request has hash ``h_i = H(h_{i-1}, tokens_i)``
  (xxhash64 over the parent hash and the block's token ids; block 0 chains from a seed-derived
  ``NONE_HASH`` plus the request's ``cache_salt``): a 64-bit unsigned int.
- A block is cached (findable) as soon as a request is scheduled to compute it, so requests in
  flight share blocks: a later request finds the blocks an earlier one is computing in the same or
  a later step and does not compute them again (vLLM caches at ``allocate_slots`` time).
- Ref counts: a block held by any running request is never evicted. Freed blocks (ref 0) that carry a
  hash join the free queue's tail, a request's blocks in reverse order so its tail is evicted first;
  freed blocks without one (the last, partial block of a prompt and its output, or any block with
  caching off) go to its head, to be reused first, as vLLM's ``BlockPool.free_blocks`` does (0.32).
  Allocation pops the queue's head and evicts its hash then: LRU over unheld cached blocks, and a
  partial block never takes a cached block's place.
- Two blocks may carry the same hash (vLLM does not deduplicate); a lookup finds the first.
- KV events (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``) queue here until the engine
  takes them at the end of its step.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import xxhash

from burstsched.prefix.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

NULL_BLOCK_ID = 0
KV_CACHE_SPEC_KIND = "full_attention"


class BlockHasher:
    """Chained block hashes for one replica (its seed fixes ``NONE_HASH``, as ``PYTHONHASHSEED`` does)."""

    def __init__(self, block_size: int, seed: int = 0) -> None:
        self.block_size = block_size
        self.none_hash = xxhash.xxh64_intdigest(b"burstsched-sim:NONE_HASH", seed=seed & 0xFFFFFFFFFFFFFFFF)

    def hash_block(self, parent: int | None, tokens: Sequence[int], cache_salt: str | None = None) -> int:
        """The hash of one full block given its parent's hash (None for the first block)."""
        h = xxhash.xxh64()
        h.update((self.none_hash if parent is None else parent).to_bytes(8, "little"))
        h.update(array("Q", tokens).tobytes())
        if cache_salt is not None and parent is None:
            h.update(b"\x00salt\x00" + cache_salt.encode("utf-8"))
        return h.intdigest()

    def extend(self, hashes: list[int], tokens: Sequence[int], cache_salt: str | None = None) -> None:
        """Append to ``hashes`` the hashes of the full blocks of ``tokens`` not hashed yet."""
        bs = self.block_size
        while (len(hashes) + 1) * bs <= len(tokens):
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(self.hash_block(parent, tokens[i * bs : (i + 1) * bs], cache_salt))


class BlockCache:
    """Blocks, their ref counts and hashes, the LRU free queue, and pending KV events."""

    def __init__(self, num_gpu_blocks: int, block_size: int, *, enable_caching: bool = True) -> None:
        if num_gpu_blocks < 2:
            raise ValueError("num_gpu_blocks must be >= 2")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._ref = [0] * num_gpu_blocks
        self._hash: list[int | None] = [None] * num_gpu_blocks
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, num_gpu_blocks))
        self._cached: dict[int, dict[int, None]] = {}
        self._events: list[KVEvent] = []

    # -- state ---------------------------------------------------------------------------------------
    @property
    def num_usable_blocks(self) -> int:
        return self.num_gpu_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks no running request holds (cached-but-idle blocks count as free: they are evictable)."""
        return len(self._free)

    @property
    def num_held_blocks(self) -> int:
        return self.num_usable_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """vLLM's ``kv_cache_usage_perc``: held blocks over usable blocks."""
        return 1.0 - len(self._free) / self.num_usable_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks that carry a hash (held or not)."""
        return sum(len(ids) for ids in self._cached.values())

    def cached_hashes(self) -> set[int]:
        return set(self._cached)

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def block_hash(self, block_id: int) -> int | None:
        return self._hash[block_id]

    def free_queue(self) -> list[int]:
        """Block ids in eviction order (first evicted first)."""
        return list(self._free)

    # -- lookups and allocation -----------------------------------------------------------------------
    def longest_hit(self, block_hashes: Sequence[int], max_tokens: int) -> list[int]:
        """Block ids of the longest cached prefix of ``block_hashes``, at most ``max_tokens`` tokens."""
        if not self.enable_caching:
            return []
        hit: list[int] = []
        for block_hash in block_hashes[: max(0, max_tokens) // self.block_size]:
            ids = self._cached.get(block_hash)
            if not ids:
                break
            hit.append(next(iter(ids)))
        return hit

    def can_allocate(self, num_new_blocks: int, hit_block_ids: Iterable[int] = ()) -> bool:
        """Whether ``num_new_blocks`` new blocks fit once ``hit_block_ids`` leave the free queue."""
        idle_hits = sum(1 for b in hit_block_ids if self._ref[b] == 0)
        return num_new_blocks + idle_hits <= len(self._free)

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take cache hits: one more holder each; idle ones leave the free queue."""
        for b in block_ids:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` blocks from the head of the free queue, evicting the hashes they carried."""
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} blocks, {len(self._free)} free")
        out: list[int] = []
        for _ in range(n):
            b, _none = self._free.popitem(last=False)
            self._evict(b)
            self._ref[b] = 1
            out.append(b)
        return out

    def free(self, block_ids_in_eviction_order: Iterable[int]) -> None:
        """Drop one holder of each block. Blocks nobody holds join the free queue in this order: cached
        ones at its tail, uncached ones (no hash) ahead of everything, to be reused first."""
        uncached: list[int] = []
        for b in block_ids_in_eviction_order:
            if b == NULL_BLOCK_ID:
                continue
            self._ref[b] -= 1
            if self._ref[b] < 0:
                raise AssertionError(f"block {b} freed more often than held")
            if self._ref[b] == 0:
                if self._hash[b] is None:
                    uncached.append(b)
                else:
                    self._free[b] = None
        for b in reversed(uncached):  # prepended as a group, in the order given
            self._free[b] = None
            self._free.move_to_end(b, last=False)

    def cache_blocks(
        self,
        block_ids: Sequence[int],
        block_hashes: Sequence[int],
        token_ids: Sequence[int],
        parent_hash: int | None,
    ) -> None:
        """Register full blocks under their hashes and queue one ``BlockStored`` for them."""
        if not self.enable_caching or not block_ids:
            return
        for b, h in zip(block_ids, block_hashes, strict=True):
            if self._hash[b] is not None:
                raise AssertionError(f"block {b} is already cached")
            self._hash[b] = h
            self._cached.setdefault(h, {})[b] = None
        self._events.append(
            BlockStored(
                block_hashes=tuple(block_hashes),
                parent_block_hash=parent_hash,
                token_ids=tuple(token_ids),
                block_size=self.block_size,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                extra_keys=tuple(None for _ in block_ids),
                group_idx=0,
                kv_cache_spec_kind=KV_CACHE_SPEC_KIND,
            )
        )

    def reset(self) -> bool:
        """Forget every hash, as vLLM's ``reset_prefix_cache``; refused (False) while any block is held."""
        if self.num_held_blocks:
            return False
        self._cached.clear()
        self._hash = [None] * self.num_gpu_blocks
        self._free = OrderedDict((i, None) for i in range(1, self.num_gpu_blocks))
        if self.enable_caching:
            self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVEvent]:
        events, self._events = self._events, []
        return events

    def _evict(self, b: int) -> None:
        h = self._hash[b]
        if h is None:
            return
        self._hash[b] = None
        ids = self._cached[h]
        del ids[b]
        if not ids:
            del self._cached[h]
        self._events.append(BlockRemoved(block_hashes=(h,), medium="GPU", group_idx=0))
