"""The approximate prefix index: which endpoint was sent which block hashes, bounded per endpoint (LRU)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from burstsched_plugins.blocktable import BlockTable


class PrefixIndex:
    """Per-endpoint LRU sets of block hashes, matched by the longest chain each endpoint holds.

    Each endpoint holds at most its capacity in blocks; adding past it evicts that endpoint's least recently
    added blocks (after the whole chain is in, so the bound holds whenever :meth:`add` returns). A chain is
    added tail first, so its leading blocks (shared by the most requests) are the freshest and the last to go.

    Storage is a :class:`~burstsched_plugins.blocktable.BlockTable`: numpy arrays, no Python object per
    block, growth one small piece at a time (see there for the bounds on a single call's work).
    """

    def __init__(self, default_capacity: int) -> None:
        if default_capacity < 1:
            raise ValueError("default_capacity must be at least 1")
        self._table = BlockTable(default_capacity, with_values=False)

    def capacity(self, endpoint: str) -> int:
        return self._table.capacity(endpoint)

    def set_capacity(self, endpoint: str, blocks: int) -> None:
        """Bound ``endpoint`` to ``blocks`` blocks (at least 1), evicting its oldest ones if needed."""
        if self._table.capacity(endpoint) != max(1, blocks):  # called at every decision: cheap when unchanged
            self._table.set_capacity(endpoint, blocks)

    def add(self, endpoint: str, hashes: Sequence[int]) -> None:
        """Record that ``endpoint`` was sent ``hashes`` (a chain from block 0)."""
        self._table.touch(endpoint, hashes)

    def match(self, hashes: Sequence[int], endpoints: Iterable[str]) -> dict[str, int]:
        """For each endpoint, how many of ``hashes`` it holds contiguously from block 0."""
        return self._table.match(hashes, endpoints)

    def size(self, endpoint: str) -> int:
        """How many blocks ``endpoint`` holds."""
        return self._table.size(endpoint)

    def holds(self, endpoint: str, block: int) -> bool:
        """Whether ``endpoint``'s own LRU set holds ``block``."""
        return self._table.holds(endpoint, block)

    def entries(self) -> int:
        """How many (block, endpoint) entries the index holds, over all endpoints."""
        return self._table.entries()

    def nbytes(self) -> int:
        """Bytes of the index's arrays."""
        return self._table.nbytes()

    def clear(self) -> None:
        """Drop every block (capacities stay)."""
        self._table.clear()

    def remove_endpoint(self, endpoint: str) -> None:
        """Drop every block ``endpoint`` holds (its capacity setting stays)."""
        self._table.drop_endpoint(endpoint)
