"""``BlockTable``: which endpoint holds which blocks, in compact arrays with per-endpoint LRU bounds.

The storage (node pages and hash shards, see :mod:`~burstsched_plugins.blocktable.kernels`) is numpy memory
owned here and walked by numba kernels. No operation touches more than a bounded part of it at once, so the
event loop never stalls on the index however large it gets:

- growth is per piece: a node page (``PAGE`` entries) is added, or one hash shard (1/``SHARDS`` of a table)
  doubles and is rehashed alone; there are no Python objects per entry, so the garbage collector has nothing
  to walk;
- dropping an endpoint (:meth:`drop_endpoint`) hides it at once and frees its entries in chunks of
  ``drain_chunk``, one chunk per later mutating call; its id is reused only once it is empty;
- :meth:`clear` swaps in fresh storage; the old arrays go back to the allocator 8 MiB at a time,
  one batch per later mutating call (returning a large index's pages to the OS takes milliseconds).

Eviction is exact per-endpoint LRU, batched per call: a touch first inserts the whole chain, then drops the
endpoint's oldest entries down to its capacity, so an endpoint never holds more than its capacity when a call
returns. Shrinking a capacity evicts synchronously (O(entries evicted): about 8 ms for 31 000 entries on a
2-core VM). Tables never shrink until :meth:`clear`.

Keys and router hashes are 64-bit: ints in [0, 2**64) (others are taken modulo 2**64). Every value is a valid
key: emptiness is marked outside the key words.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from burstsched_plugins.blocktable import kernels as k

_U64_MASK = (1 << 64) - 1
_DRAIN_CHUNK = 8192
_RELEASE_BYTES = 8 << 20
_MATCH_IDS_CACHED = 64
"""Endpoint lists whose ids :meth:`BlockTable.match` keeps (cleared whenever an id changes)."""


def as_keys(values: Sequence[int]) -> npt.NDArray[np.uint64]:
    """``values`` as a uint64 array (ints outside [0, 2**64) are taken modulo 2**64)."""
    try:
        return np.asarray(values, dtype=np.uint64)
    except OverflowError:
        return np.asarray([v & _U64_MASK for v in values], dtype=np.uint64)


class BlockTable:
    """(block, endpoint) entries under a per-endpoint LRU bound, matched by the longest held chain.

    Each entry has a key (the block's name for insert, refresh and remove) and a router hash (the name chains
    are matched by); without ``with_values`` the two are the same and only the key is stored. Endpoints are
    names, mapped to small ids (the lowest free one first, so a pool of up to 64 endpoints stays on the
    bitmask fast path).
    """

    _match_ids: dict[tuple[str, ...], npt.NDArray[np.int64]]
    """The ids of endpoint lists :meth:`match` was asked about (cleared whenever an id changes)."""
    _last_chain: Sequence[int] | None
    """The last tuple :meth:`_keys` converted, and its array."""
    _last_keys: npt.NDArray[np.uint64]

    def __init__(
        self, default_capacity: int, *, with_values: bool, drain_chunk: int = _DRAIN_CHUNK, warm: bool = True
    ) -> None:
        """``warm``: compile the kernels now (once per process), so that no request pays for it."""
        if default_capacity < 1:
            raise ValueError("default_capacity must be at least 1")
        if drain_chunk < 1:
            raise ValueError("drain_chunk must be at least 1")
        if warm:
            compile_kernels()
        self._default_capacity = default_capacity
        self._with_values = with_values
        self._drain_chunk = drain_chunk
        self._capacity: dict[str, int] = {}
        self._graveyard: list[npt.NDArray[Any]] = []
        self._reset()

    # --- endpoints ------------------------------------------------------------------------------------------

    def capacity(self, endpoint: str) -> int:
        return self._capacity.get(endpoint, self._default_capacity)

    def set_capacity(self, endpoint: str, blocks: int) -> int:
        """Bound ``endpoint`` to ``blocks`` entries (at least 1); returns how many of its oldest ones went."""
        blocks = max(1, blocks)
        self._capacity[endpoint] = blocks
        ep = self._ids.get(endpoint)
        if ep is None:
            return 0
        self._drain()
        self._core.eps[ep, k.E_CAP] = blocks
        return int(k.evict(self._core, ep, blocks, int(self._core.eps[ep, k.E_SIZE])))

    def drop_endpoint(self, endpoint: str) -> None:
        """Forget every entry of ``endpoint`` (at once for lookups; memory comes back in chunks)."""
        ep = self._ids.pop(endpoint, None)
        if ep is None:
            return
        self._match_ids.clear()
        self._retiring.append(ep)
        self._drain()

    def size(self, endpoint: str) -> int:
        """How many entries ``endpoint`` holds."""
        ep = self._ids.get(endpoint)
        return 0 if ep is None else int(self._core.eps[ep, k.E_SIZE])

    def endpoints(self) -> list[str]:
        """The endpoints holding at least one entry, sorted."""
        sizes = self._core.eps[:, k.E_SIZE]
        return sorted(name for name, ep in self._ids.items() if sizes[ep] > 0)

    def entries(self) -> int:
        """How many (block, endpoint) entries the table holds (dropped endpoints not counted)."""
        return int(self._core.g[k.G_USED]) - self.pending_drain()

    def pending_drain(self) -> int:
        """Entries of dropped endpoints not yet freed (they are invisible already)."""
        return sum(int(self._core.eps[ep, k.E_SIZE]) for ep in self._retiring)

    def nbytes(self) -> int:
        """Bytes of all the table's arrays (with those a :meth:`clear` has not released yet)."""
        total = sum(a.nbytes for a in self._core) + sum(a.nbytes for a in self._graveyard)
        total += sum(page.nbytes for field in self._pages for page in field)
        total += sum(shard.nbytes for table in self._shards for shard in table if shard is not None)
        return total

    # --- entries -------------------------------------------------------------------------------------------

    def touch(self, endpoint: str, keys: Sequence[int], values: Sequence[int] | None = None) -> int:
        """Insert or refresh ``endpoint``'s entries for ``keys`` (a chain, block 0 first), last key first.

        ``values`` are the keys' router hashes (only with ``with_values``; a refreshed key takes its new one).
        The chain's leading blocks end up freshest. Then the endpoint's oldest entries beyond its capacity go;
        returns how many went.
        """
        key_array = self._keys(keys)
        if values is None:
            if self._with_values:
                raise ValueError("this table stores router hashes: pass values")
            value_array = key_array
        else:
            if not self._with_values:
                raise ValueError("this table stores no router hashes: pass no values")
            value_array = as_keys(values)
            if value_array.shape != key_array.shape:
                raise ValueError("keys and values differ in length")
        self._drain()
        ep = self._id_for(endpoint)
        done = 0
        while done < key_array.shape[0]:
            done = k.touch(self._core, ep, key_array, value_array, done)
            if done < key_array.shape[0]:
                self._grow()
        limit, size = int(self._core.eps[ep, k.E_CAP]), int(self._core.eps[ep, k.E_SIZE])
        if size <= limit:  # a refreshed chain, or room left: no kernel call
            return 0
        return int(k.evict(self._core, ep, limit, size))

    def remove(self, endpoint: str, keys: Sequence[int]) -> int:
        """Drop ``endpoint``'s entries for ``keys`` (unknown ones ignored); how many were there."""
        ep = self._ids.get(endpoint)
        if ep is None or not keys:
            return 0
        self._drain()
        return int(k.remove(self._core, ep, as_keys(keys)))

    def holds(self, endpoint: str, key: int) -> bool:
        return self.value(endpoint, key) is not None

    def value(self, endpoint: str, key: int) -> int | None:
        """The router hash of ``endpoint``'s entry ``key``, or None if it holds none."""
        ep = self._ids.get(endpoint)
        if ep is None:
            return None
        out = np.zeros(1, np.uint64)
        if not k.find(self._core, ep, np.uint64(key & _U64_MASK), out):
            return None
        return int(out[0])

    def match(self, hashes: Sequence[int], endpoints: Iterable[str]) -> dict[str, int]:
        """For each endpoint, how many of ``hashes`` (router hashes) it holds contiguously from block 0."""
        names = tuple(dict.fromkeys(endpoints))
        if not names or not len(hashes):
            return dict.fromkeys(names, 0)
        ids = self._match_ids.get(names)
        if ids is None:  # the same few endpoint lists every request: their ids are looked up once
            if len(self._match_ids) >= _MATCH_IDS_CACHED:
                self._match_ids.clear()
            ids = self._match_ids[names] = np.array([self._ids.get(name, -1) for name in names], np.int64)
        out = np.empty(len(names), np.int64)
        k.match(self._core, self._keys(hashes), ids, out)
        return dict(zip(names, out.tolist(), strict=True))

    def _keys(self, chain: Sequence[int]) -> npt.NDArray[np.uint64]:
        """``as_keys(chain)``; a tuple converted by the call before is not converted again (a request's
        chain is matched, then touched on dispatch)."""
        if chain is self._last_chain:
            return self._last_keys
        keys = as_keys(chain)
        if type(chain) is tuple:  # immutable: safe to recognise by identity while it is held here
            self._last_chain, self._last_keys = chain, keys
        return keys

    def clear(self) -> None:
        """Drop every entry (capacities stay)."""
        self._graveyard.extend(page for field in self._pages for page in field)
        self._graveyard.extend(shard for table in self._shards for shard in table if shard is not None)
        self._reset()
        self._drain()

    # --- storage -------------------------------------------------------------------------------------------

    def _reset(self) -> None:
        self._match_ids = {}
        self._last_chain = None
        self._last_keys = np.empty(0, np.uint64)
        self._ids: dict[str, int] = {}
        self._next_id = 0
        self._free_ids: list[int] = []
        self._retiring: list[int] = []
        fields = k.NODE_FIELDS
        self._pages: list[list[npt.NDArray[Any]]] = [[] for _ in range(fields)]
        self._shards: list[list[npt.NDArray[Any] | None]] = [[None] * k.SHARDS for _ in range(3)]
        g = np.zeros(k.G_FIELDS, np.int64)
        g[k.G_FREE] = -1
        g[k.G_WITH_VAL] = int(self._with_values)
        self._core = k.Core(
            g=g,
            pages=np.zeros((fields, 4), np.int64),
            shards=np.zeros((k.TABLES, k.S_FIELDS, k.SHARDS), np.int64),
            eps=np.zeros((8, k.E_FIELDS), np.int64),
        )

    def _id_for(self, endpoint: str) -> int:
        ep = self._ids.get(endpoint)
        if ep is not None:
            return ep
        if self._free_ids:
            ep = heapq.heappop(self._free_ids)
        else:
            ep = self._next_id
            self._next_id += 1
            if ep >= self._core.eps.shape[0]:
                eps = np.zeros((2 * self._core.eps.shape[0], k.E_FIELDS), np.int64)
                eps[: self._core.eps.shape[0]] = self._core.eps
                self._core = self._core._replace(eps=eps)
        self._core.eps[ep] = (-1, -1, 0, self.capacity(endpoint))
        self._ids[endpoint] = ep
        self._match_ids.clear()
        return ep

    def _drain(self) -> None:
        """Free up to one chunk of a dropped endpoint's entries (releasing the ids of those now empty) and up
        to 8 MiB of the arrays a :meth:`clear` let go."""
        released = 0
        while self._graveyard and released < _RELEASE_BYTES:
            released += self._graveyard.pop().nbytes
        budget = self._drain_chunk
        while self._retiring and budget > 0:
            ep = self._retiring[0]
            budget -= int(k.evict(self._core, ep, 0, budget))
            if self._core.eps[ep, k.E_SIZE] == 0:
                self._retiring.pop(0)
                heapq.heappush(self._free_ids, ep)

    def _grow(self) -> None:
        """Grow what the last kernel call asked for: a node page, or one shard of one table."""
        table = int(self._core.g[k.G_GROW_TABLE])
        if table == k.T_NODES:
            self._add_page()
        else:
            self._grow_shard(table, int(self._core.g[k.G_GROW_SHARD]))

    def _grow_shard(self, table: int, shard: int) -> None:
        """Rehash one shard into a new array: twice the size, or the same if tombstones filled most of it."""
        header = self._core.shards[table, :, shard]
        slots = int(header[k.S_SLOTS])
        if (
            header[k.S_COUNT] + 1
        ) * 8 > slots * 3:  # live entries past 3/8: double (else just drop tombstones)
            slots = max(k.MIN_SLOTS, 2 * slots)
        array = np.zeros(
            slots if table == k.T_ENTRY else 2 * slots, np.int32 if table == k.T_ENTRY else np.uint64
        )
        if header[k.S_SLOTS]:
            k.rehash(self._core, table, shard, array.ctypes.data, slots)
        header[k.S_ADDR] = array.ctypes.data
        header[k.S_SLOTS] = slots
        header[k.S_DEAD] = 0
        self._shards[table][shard] = array  # the old shard array is freed only now, after the swap

    def _add_page(self) -> None:
        page = len(self._pages[k.N_KEY])
        if page >= self._core.pages.shape[1]:
            pages = np.zeros((k.NODE_FIELDS, 2 * self._core.pages.shape[1]), np.int64)
            pages[:, : self._core.pages.shape[1]] = self._core.pages
            self._core = self._core._replace(pages=pages)
        for field, dtype in ((k.N_KEY, np.uint64), (k.N_VAL, np.uint64), (k.N_PREV, np.int32),
                             (k.N_NEXT, np.int32), (k.N_EP, np.int32)):  # fmt: skip
            if field == k.N_VAL and not self._with_values:
                continue
            array = np.empty(k.PAGE, dtype)
            self._pages[field].append(array)
            self._core.pages[field, page] = array.ctypes.data
        self._core.g[k.G_NODE_CAP] += k.PAGE


@functools.cache
def compile_kernels() -> None:
    """Compile (or load from numba's cache) every kernel once per process, before the first request."""
    table = BlockTable(2, with_values=True, drain_chunk=1, warm=False)
    for ep in range(k.LOW_ENDPOINTS + 1):
        table.touch(f"e{ep}", list(range(12)), [1] * 12)
    table.match([1, 2], ["e0", f"e{k.LOW_ENDPOINTS}", "unknown"])
    table.value("e0", 0)
    table.remove("e0", [0, 11])
    table.set_capacity("e1", 1)
    table.drop_endpoint("e2")
    for shard_table in (k.T_ENTRY, k.T_MASK, k.T_PAIR):
        table._grow_shard(shard_table, 0)
        table._grow_shard(shard_table, 0)  # a rehash of the slots the first one allocated
