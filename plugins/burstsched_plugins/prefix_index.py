"""The approximate prefix index: which endpoint was sent which block hashes, bounded per endpoint (LRU)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class PrefixIndex:
    """Per-endpoint LRU sets of block hashes, and a hash → endpoints map for lookups.

    Each endpoint holds at most its capacity in blocks; adding past it evicts that endpoint's least recently
    added blocks. A chain is added tail first, so its leading blocks (shared by the most requests) are the
    freshest and the last to go.
    """

    def __init__(self, default_capacity: int) -> None:
        if default_capacity < 1:
            raise ValueError("default_capacity must be at least 1")
        self._default_capacity = default_capacity
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}
        self._owners: dict[int, set[str]] = {}

    def capacity(self, endpoint: str) -> int:
        return self._capacity.get(endpoint, self._default_capacity)

    def set_capacity(self, endpoint: str, blocks: int) -> None:
        """Bound ``endpoint`` to ``blocks`` blocks (at least 1), evicting its oldest ones if needed."""
        blocks = max(1, blocks)
        if self._capacity.get(endpoint) == blocks:
            return
        self._capacity[endpoint] = blocks
        self._evict(endpoint)

    def add(self, endpoint: str, hashes: Sequence[int]) -> None:
        """Record that ``endpoint`` was sent ``hashes`` (a chain from block 0)."""
        lru = self._lru.setdefault(endpoint, OrderedDict())
        for block in reversed(hashes):
            if block in lru:
                lru.move_to_end(block)
            else:
                lru[block] = None
                owners = self._owners.get(block)
                if owners is None:
                    self._owners[block] = {endpoint}
                else:
                    owners.add(endpoint)
        self._evict(endpoint)

    def match(self, hashes: Sequence[int], endpoints: Iterable[str]) -> dict[str, int]:
        """For each endpoint, how many of ``hashes`` it holds contiguously from block 0."""
        matched = dict.fromkeys(endpoints, 0)
        alive = set(matched)
        for depth, block in enumerate(hashes):
            owners = self._owners.get(block)
            if not owners:
                break
            alive &= owners
            if not alive:
                break
            for endpoint in alive:
                matched[endpoint] = depth + 1
        return matched

    def size(self, endpoint: str) -> int:
        """How many blocks ``endpoint`` holds."""
        lru = self._lru.get(endpoint)
        return len(lru) if lru is not None else 0

    def holds(self, endpoint: str, block: int) -> bool:
        """Whether ``endpoint``'s own LRU set holds ``block``."""
        lru = self._lru.get(endpoint)
        return lru is not None and block in lru

    def clear(self) -> None:
        self._lru.clear()
        self._owners.clear()

    def remove_endpoint(self, endpoint: str) -> None:
        """Drop every block ``endpoint`` holds (its capacity setting stays)."""
        lru = self._lru.pop(endpoint, None)
        if lru is None:
            return
        for block in lru:
            owners = self._owners.get(block)
            if owners is not None:
                owners.discard(endpoint)
                if not owners:
                    del self._owners[block]

    def _evict(self, endpoint: str) -> None:
        lru = self._lru.get(endpoint)
        if lru is None:
            return
        limit = self.capacity(endpoint)
        while len(lru) > limit:
            block, _ = lru.popitem(last=False)
            owners = self._owners.get(block)
            if owners is not None:
                owners.discard(endpoint)
                if not owners:
                    del self._owners[block]
