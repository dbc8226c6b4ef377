"""The precise prefix index: the blocks each replica reported in its KV-cache events, by both their names.

vLLM names a block by its own hash (the *engine hash*); the router names the same tokens by its chained hash
(the *router hash*). Entries are stored and removed by engine hash, as the events name them, and matched by
router hash, as requests are hashed. ``router_hash`` lets a ``BlockStored`` event whose parent came in an
earlier event continue the router's chain.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from burstsched_plugins.blocktable import BlockTable


class PreciseIndex:
    """(engine hash, endpoint) → router hash entries, matched by the longest router-hash chain held.

    Each endpoint is bounded by a capacity in blocks, a safety bound for when events go missing (vLLM reports
    its own evictions): past it the endpoint's least recently stored entries go, counted by
    :meth:`overflow_evictions`. Within one ``store`` call the chain is stored tail first, so its leading
    blocks are the last to go. Two engine hashes of one endpoint may name the same router hash; the router
    hash stays matched until both are removed.

    Storage is a :class:`~burstsched_plugins.blocktable.BlockTable` (numpy arrays, bounded work per call;
    ``clear_endpoint`` hides the endpoint at once and frees its memory in chunks over later calls).
    """

    def __init__(self, default_capacity: int) -> None:
        if default_capacity < 1:
            raise ValueError("default_capacity must be at least 1")
        self._table = BlockTable(default_capacity, with_values=True)
        self._overflow: dict[str, int] = {}

    def capacity(self, endpoint: str) -> int:
        return self._table.capacity(endpoint)

    def set_capacity(self, endpoint: str, blocks: int) -> None:
        """Bound ``endpoint`` to ``blocks`` entries (at least 1), evicting its least recently stored ones."""
        self._count_overflow(endpoint, self._table.set_capacity(endpoint, blocks))

    def store(self, endpoint: str, engine_hashes: Sequence[int], router_hashes: Sequence[int]) -> None:
        """``endpoint`` stored these blocks (same length, chain order); a known engine hash is refreshed."""
        if len(engine_hashes) != len(router_hashes):
            raise ValueError("engine_hashes and router_hashes differ in length")
        if engine_hashes:
            self._count_overflow(endpoint, self._table.touch(endpoint, engine_hashes, router_hashes))

    def router_hash(self, endpoint: str, engine_hash: int) -> int | None:
        """The router hash of ``endpoint``'s block ``engine_hash``, or None if it holds no such block."""
        return self._table.value(endpoint, engine_hash)

    def remove(self, endpoint: str, engine_hashes: Sequence[int]) -> int:
        """``endpoint`` evicted these blocks; returns how many it held (unknown hashes are ignored)."""
        return self._table.remove(endpoint, engine_hashes)

    def clear_endpoint(self, endpoint: str) -> None:
        """Drop every block of ``endpoint`` (its capacity and overflow count stay)."""
        self._table.drop_endpoint(endpoint)

    def clear(self) -> None:
        """Drop every block of every endpoint (capacities and overflow counts stay)."""
        self._table.clear()

    def match(self, router_hashes: Sequence[int], endpoints: Iterable[str]) -> dict[str, int]:
        """For each endpoint, how many of ``router_hashes`` it holds contiguously from block 0."""
        return self._table.match(router_hashes, endpoints)

    def size(self, endpoint: str) -> int:
        """How many blocks ``endpoint`` holds."""
        return self._table.size(endpoint)

    def entries(self) -> int:
        """How many (block, endpoint) entries the index holds, over all endpoints."""
        return self._table.entries()

    def nbytes(self) -> int:
        """Bytes of the index's arrays."""
        return self._table.nbytes()

    def endpoints(self) -> list[str]:
        """The endpoints holding at least one block, sorted."""
        return self._table.endpoints()

    def overflow_evictions(self, endpoint: str) -> int:
        """How many of ``endpoint``'s blocks went because it was past its capacity (since the start)."""
        return self._overflow.get(endpoint, 0)

    def _count_overflow(self, endpoint: str, evicted: int) -> None:
        if evicted:
            self._overflow[endpoint] = self._overflow.get(endpoint, 0) + evicted
