"""The numba kernels of the block table: open-addressed hash shards, per-endpoint LRU lists, chain matching.

Storage (owned and grown by :class:`~burstsched_plugins.blocktable.table.BlockTable`, reached here through
the four small int64 arrays of :class:`Core`):

- **Nodes**, one per (block, endpoint) entry, in fixed-size pages of parallel arrays: ``key`` (the block's
  name: the router hash, or vLLM's engine hash in the precise index), ``val`` (the router hash, precise index
  only), ``prev``/``next`` (the endpoint's LRU list, oldest first; ``next`` also links free nodes) and
  ``ep`` (the endpoint's small integer id). A node never moves, so links are plain node ids.
- **Entry shards** (table ``T_ENTRY``): (key, ep) → node id + 1, int32 slots, 0 = empty, -1 = deleted (a
  tombstone: deleting by shifting would read the node of every later slot of the run, a cache miss each; the
  tombstones go when the shard is next rehashed, at the same size if it is mostly tombstones).
- **Mask shards** (``T_MASK``): router hash → bitmask of the endpoints with id < 64 that hold it, slots of
  two uint64 words (hash, mask); a zero mask is an empty slot, so no hash value is a sentinel.
- **Pair shards** (``T_PAIR``): (router hash, ep) → count, for endpoints with id ≥ 64 (no mask bit) and
  for the rare second engine hash of one endpoint that maps to a router hash already held (so ``remove``
  clears the mask bit only when the last one goes); slots (hash, ep << 32 | count), a zero second word is
  empty.

Every table is split into ``SHARDS`` shards by the top bits of a mixed hash; each shard is its own
linear-probing array that grows alone, so growing never rehashes more
than one shard.
Kernels that insert are resumable: when a node page or a shard slot is missing they record what to grow in
``Core.g`` and return how far they got; the caller grows it and calls again from there.

The helpers work on raw addresses (a :data:`View` of ints, read and written through two tiny LLVM intrinsics),
not on numpy arrays: numba reference-counts every array it passes around, and those atomic counts cost more
than the hash probes themselves. The public kernels take :class:`Core` (which keeps the arrays alive for the
call) and build the view once.

All kernels live in this one module on purpose: numba's on-disk cache (``cache=True``) checks only the source
file of the function it caches, so helpers kept in another module could be served stale after an edit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt
from numba import types
from numba.extending import intrinsic

_F = TypeVar("_F", bound=Callable[..., Any])

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

SHARD_BITS = 8
SHARDS = 1 << SHARD_BITS
PAGE_BITS = 14
PAGE = 1 << PAGE_BITS
PAGE_MASK = PAGE - 1
LOW_ENDPOINTS = 64
"""Endpoints with ids below this have a bit in the mask shards; the others are matched through pair shards."""
MIN_SLOTS = 8
EVICT_BATCH = 1024
WARM_BATCH = 256

T_ENTRY, T_MASK, T_PAIR, T_NODES = 0, 1, 2, 3
TABLES = 3
S_ADDR, S_SLOTS, S_COUNT, S_DEAD = 0, 1, 2, 3
S_FIELDS = 4
N_KEY, N_VAL, N_PREV, N_NEXT, N_EP = 0, 1, 2, 3, 4
NODE_FIELDS = 5
G_FREE, G_HWM, G_NODE_CAP, G_WITH_VAL, G_GROW_TABLE, G_GROW_SHARD, G_USED, G_SINK = 0, 1, 2, 3, 4, 5, 6, 7
G_FIELDS = 8
E_HEAD, E_TAIL, E_SIZE, E_CAP = 0, 1, 2, 3
E_FIELDS = 4

_SHARD_SHIFT = np.uint64(64 - SHARD_BITS)
_S27, _S30, _S31, _S32 = np.uint64(27), np.uint64(30), np.uint64(31), np.uint64(32)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_LOW32 = np.uint64(0xFFFFFFFF)
_ONE = np.uint64(1)
_ZERO = np.uint64(0)


class Core(NamedTuple):
    """What every kernel gets: four small int64 arrays (scalars, page addresses, shard headers, endpoints)."""

    g: I64
    """Scalars, indexed by ``G_*``."""
    pages: I64
    """``pages[N_*, page]``: address of that node field's page (0 where not allocated)."""
    shards: I64
    """``shards[T_*, S_*, shard]``: address, slot count (a power of two, 0 = not allocated), entries."""
    eps: I64
    """``eps[ep, E_*]``: LRU head and tail node (-1 when empty), size and capacity of each endpoint id."""


View = tuple[int, int, int, int, int]
"""Addresses of ``Core``'s arrays: (g, pages, pages' row length, shards, eps)."""


def _kernel(fn: _F) -> _F:
    """A kernel called from Python: compiled by numba, cached on disk."""
    return cast(_F, numba.njit(cache=True)(fn))


def _helper(fn: _F) -> _F:
    """A helper of the kernels, inlined into them."""
    return cast(_F, numba.njit(cache=True, inline="always")(fn))


def _pointer_to(nbtype: Any) -> Any:
    pointer: Any = types.CPointer
    return pointer(nbtype)


def _make_load(nbtype: Any) -> Any:
    """A numba intrinsic reading ``nbtype`` element ``index`` of the array at address ``addr``."""

    @intrinsic
    def load(typingctx: Any, addr: Any, index: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            base = context.cast(builder, args[0], signature.args[0], types.intp)
            offset = context.cast(builder, args[1], signature.args[1], types.intp)
            pointer = builder.inttoptr(base, context.get_value_type(_pointer_to(nbtype)))
            return builder.load(builder.gep(pointer, [offset]))

        return nbtype(addr, index), codegen

    return load


def _make_store(nbtype: Any) -> Any:
    """A numba intrinsic writing ``value`` (cast to ``nbtype``) as element ``index`` at ``addr``."""

    @intrinsic
    def store(typingctx: Any, addr: Any, index: Any, value: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            base = context.cast(builder, args[0], signature.args[0], types.intp)
            offset = context.cast(builder, args[1], signature.args[1], types.intp)
            item = context.cast(builder, args[2], signature.args[2], nbtype)
            pointer = builder.inttoptr(base, context.get_value_type(_pointer_to(nbtype)))
            builder.store(item, builder.gep(pointer, [offset]))
            return context.get_dummy_value()

        return types.void(addr, index, value), codegen

    return store


_load_u64: Callable[[Any, Any], Any] = _make_load(types.uint64)
_store_u64: Callable[[Any, Any, Any], None] = _make_store(types.uint64)
_load_i64: Callable[[Any, Any], Any] = _make_load(types.int64)
_store_i64: Callable[[Any, Any, Any], None] = _make_store(types.int64)
_load_i32: Callable[[Any, Any], Any] = _make_load(types.int32)
_store_i32: Callable[[Any, Any, Any], None] = _make_store(types.int32)


# --- the view: Core's arrays by address ---------------------------------------------------------------------


@_helper
def _view(c: Core) -> View:
    return (c.g.ctypes.data, c.pages.ctypes.data, c.pages.shape[1], c.shards.ctypes.data, c.eps.ctypes.data)


@_helper
def _g(v: View, i: int) -> Any:
    return _load_i64(v[0], i)


@_helper
def _g_set(v: View, i: int, x: Any) -> None:
    _store_i64(v[0], i, x)


@_helper
def _sh(v: View, table: int, field: int, s: Any) -> Any:
    return _load_i64(v[3], (table * S_FIELDS + field) * SHARDS + s)


@_helper
def _sh_add(v: View, table: int, field: int, s: Any, x: Any) -> None:
    i = (table * S_FIELDS + field) * SHARDS + s
    _store_i64(v[3], i, _load_i64(v[3], i) + x)


@_helper
def _ep(v: View, ep: Any, field: int) -> Any:
    return _load_i64(v[4], ep * E_FIELDS + field)


@_helper
def _ep_set(v: View, ep: Any, field: int, x: Any) -> None:
    _store_i64(v[4], ep * E_FIELDS + field, x)


# --- hashing ------------------------------------------------------------------------------------------------


@_helper
def _mix(x: Any) -> Any:
    """splitmix64's finalizer: a bijection that spreads any key set (0, 1, 2, …) over all 64 bits."""
    x = (x ^ (x >> _S30)) * _MIX1
    x = (x ^ (x >> _S27)) * _MIX2
    return x ^ (x >> _S31)


@_helper
def _pair_hash(key: Any, ep: Any) -> Any:
    return _mix(key ^ (np.uint64(ep) * _GOLDEN))


@_helper
def _shard_of(h: Any) -> Any:
    return np.int64(h >> _SHARD_SHIFT)


@_helper
def _home(h: Any, slots: Any) -> Any:
    return np.int64(h & np.uint64(slots - 1))


@_helper
def _has_room(v: View, table: int, s: Any) -> bool:
    """Whether shard ``s`` can take one more entry and stay at most 3/4 full (tombstones count as full)."""
    used = _sh(v, table, S_COUNT, s) + _sh(v, table, S_DEAD, s)
    return bool((used + 1) * 4 <= _sh(v, table, S_SLOTS, s) * 3)


@_helper
def _need(v: View, table: int, s: Any) -> bool:
    """Record that ``table``'s shard ``s`` (or a node page) must grow; returns True."""
    _g_set(v, G_GROW_TABLE, table)
    _g_set(v, G_GROW_SHARD, s)
    return True


# --- nodes --------------------------------------------------------------------------------------------------


@_helper
def _page(v: View, field: int, n: Any) -> Any:
    return _load_i64(v[1], field * v[2] + (n >> PAGE_BITS))


@_helper
def _nkey(v: View, n: Any) -> Any:
    return _load_u64(_page(v, N_KEY, n), n & PAGE_MASK)


@_helper
def _nval(v: View, n: Any) -> Any:
    return _load_u64(_page(v, N_VAL if _g(v, G_WITH_VAL) else N_KEY, n), n & PAGE_MASK)


@_helper
def _nep(v: View, n: Any) -> Any:
    return np.int64(_load_i32(_page(v, N_EP, n), n & PAGE_MASK))


@_helper
def _nprev(v: View, n: Any) -> Any:
    return np.int64(_load_i32(_page(v, N_PREV, n), n & PAGE_MASK))


@_helper
def _nnext(v: View, n: Any) -> Any:
    return np.int64(_load_i32(_page(v, N_NEXT, n), n & PAGE_MASK))


@_helper
def _set_i32(v: View, field: int, n: Any, x: Any) -> None:
    _store_i32(_page(v, field, n), n & PAGE_MASK, x)


@_helper
def _set_u64(v: View, field: int, n: Any, x: Any) -> None:
    _store_u64(_page(v, field, n), n & PAGE_MASK, x)


@_helper
def _node_missing(v: View) -> bool:
    return bool(_g(v, G_FREE) < 0 and _g(v, G_HWM) >= _g(v, G_NODE_CAP))


@_helper
def _node_alloc(v: View) -> Any:
    n = _g(v, G_FREE)
    if n >= 0:
        _g_set(v, G_FREE, _nnext(v, n))
        return n
    n = _g(v, G_HWM)
    _g_set(v, G_HWM, n + 1)
    return n


@_helper
def _node_free(v: View, n: Any) -> None:
    _set_i32(v, N_NEXT, n, _g(v, G_FREE))
    _g_set(v, G_FREE, n)


# --- entry shards: (key, ep) -> node ------------------------------------------------------------------------


@_helper
def _entry_find(v: View, key: Any, ep: Any) -> Any:
    h = _pair_hash(key, ep)
    s = _shard_of(h)
    slots = _sh(v, T_ENTRY, S_SLOTS, s)
    if slots == 0:
        return -1
    addr = _sh(v, T_ENTRY, S_ADDR, s)
    mask = slots - 1
    i = _home(h, slots)
    while True:
        x = np.int64(_load_i32(addr, i))
        if x == 0:
            return -1
        if x > 0 and _nkey(v, x - 1) == key and _nep(v, x - 1) == ep:
            return x - 1
        i = (i + 1) & mask


@_helper
def _entry_put(addr: Any, slots: Any, h: Any, n: Any) -> bool:
    """Put node ``n`` (known absent) in the first free slot of its run; True if that was a tombstone."""
    mask = slots - 1
    i = _home(h, slots)
    while _load_i32(addr, i) > 0:
        i = (i + 1) & mask
    dead = bool(_load_i32(addr, i) < 0)
    _store_i32(addr, i, n + 1)
    return dead


@_helper
def _entry_insert(v: View, n: Any) -> None:
    h = _pair_hash(_nkey(v, n), _nep(v, n))
    s = _shard_of(h)
    if _entry_put(_sh(v, T_ENTRY, S_ADDR, s), _sh(v, T_ENTRY, S_SLOTS, s), h, n):
        _sh_add(v, T_ENTRY, S_DEAD, s, -1)
    _sh_add(v, T_ENTRY, S_COUNT, s, 1)


@_helper
def _entry_delete(v: View, n: Any) -> None:
    h = _pair_hash(_nkey(v, n), _nep(v, n))
    s = _shard_of(h)
    addr = _sh(v, T_ENTRY, S_ADDR, s)
    mask = _sh(v, T_ENTRY, S_SLOTS, s) - 1
    i = _home(h, mask + 1)
    while np.int64(_load_i32(addr, i)) != n + 1:
        i = (i + 1) & mask
    _store_i32(addr, i, -1)
    _sh_add(v, T_ENTRY, S_COUNT, s, -1)
    _sh_add(v, T_ENTRY, S_DEAD, s, 1)


# --- mask and pair shards: two-word slots -------------------------------------------------------------------


@_helper
def _word_hash(table: int, key: Any, aux: Any) -> Any:
    if table == T_MASK:
        return _mix(key)
    return _pair_hash(key, np.int64(aux >> _S32))


@_helper
def _word_put(addr: Any, slots: Any, h: Any, key: Any, aux: Any) -> None:
    mask = slots - 1
    i = _home(h, slots)
    while _load_u64(addr, 2 * i + 1) != _ZERO:
        i = (i + 1) & mask
    _store_u64(addr, 2 * i, key)
    _store_u64(addr, 2 * i + 1, aux)


@_helper
def _word_delete(v: View, table: int, s: Any, i: Any) -> None:
    addr = _sh(v, table, S_ADDR, s)
    slots = _sh(v, table, S_SLOTS, s)
    mask = slots - 1
    j = i
    while True:
        j = (j + 1) & mask
        aux = _load_u64(addr, 2 * j + 1)
        if aux == _ZERO:
            break
        key = _load_u64(addr, 2 * j)
        k = _home(_word_hash(table, key, aux), slots)
        if ((j - k) & mask) >= ((j - i) & mask):
            _store_u64(addr, 2 * i, key)
            _store_u64(addr, 2 * i + 1, aux)
            i = j
    _store_u64(addr, 2 * i + 1, _ZERO)
    _sh_add(v, table, S_COUNT, s, -1)


@_helper
def _mask_slot(v: View, key: Any, h: Any, s: Any) -> Any:
    """The slot of ``key`` (hash ``h``, shard ``s``) in the mask shards, or -1."""
    slots = _sh(v, T_MASK, S_SLOTS, s)
    if slots == 0:
        return -1
    addr = _sh(v, T_MASK, S_ADDR, s)
    mask = slots - 1
    i = _home(h, slots)
    while True:
        if _load_u64(addr, 2 * i + 1) == _ZERO:
            return -1
        if _load_u64(addr, 2 * i) == key:
            return i
        i = (i + 1) & mask


@_helper
def _mask_get(v: View, key: Any) -> Any:
    h = _mix(key)
    s = _shard_of(h)
    i = _mask_slot(v, key, h, s)
    if i < 0:
        return _ZERO
    return _load_u64(_sh(v, T_MASK, S_ADDR, s), 2 * i + 1)


@_helper
def _pair_slot(v: View, key: Any, ep: Any, h: Any, s: Any) -> Any:
    """The slot of (``key``, ``ep``) (hash ``h``, shard ``s``) in the pair shards, or -1."""
    slots = _sh(v, T_PAIR, S_SLOTS, s)
    if slots == 0:
        return -1
    addr = _sh(v, T_PAIR, S_ADDR, s)
    mask = slots - 1
    i = _home(h, slots)
    tag = np.uint64(ep) << _S32
    while True:
        aux = _load_u64(addr, 2 * i + 1)
        if aux == _ZERO:
            return -1
        if _load_u64(addr, 2 * i) == key and (aux & ~_LOW32) == tag:
            return i
        i = (i + 1) & mask


@_helper
def _pair_held(v: View, key: Any, ep: Any) -> bool:
    h = _pair_hash(key, ep)
    return bool(_pair_slot(v, key, ep, h, _shard_of(h)) >= 0)


@_helper
def _pair_inc(v: View, key: Any, ep: Any) -> None:
    h = _pair_hash(key, ep)
    s = _shard_of(h)
    i = _pair_slot(v, key, ep, h, s)
    addr = _sh(v, T_PAIR, S_ADDR, s)
    if i >= 0:
        _store_u64(addr, 2 * i + 1, _load_u64(addr, 2 * i + 1) + _ONE)
        return
    _word_put(addr, _sh(v, T_PAIR, S_SLOTS, s), h, key, (np.uint64(ep) << _S32) | _ONE)
    _sh_add(v, T_PAIR, S_COUNT, s, 1)


@_helper
def _pair_dec(v: View, key: Any, ep: Any) -> bool:
    """Count one holder of (key, ep) less; False when there was none."""
    h = _pair_hash(key, ep)
    s = _shard_of(h)
    i = _pair_slot(v, key, ep, h, s)
    if i < 0:
        return False
    addr = _sh(v, T_PAIR, S_ADDR, s)
    aux = _load_u64(addr, 2 * i + 1)
    if (aux & _LOW32) > _ONE:
        _store_u64(addr, 2 * i + 1, aux - _ONE)
    else:
        _word_delete(v, T_PAIR, s, i)
    return True


# --- holders: who holds a router hash, for matching ---------------------------------------------------------


@_helper
def _holder_missing(v: View, key: Any, ep: Any) -> bool:
    """Whether adding ``ep`` as a holder of ``key`` needs a slot that is not there (recorded in ``g``)."""
    if ep < LOW_ENDPOINTS:
        h = _mix(key)
        s = _shard_of(h)
        i = _mask_slot(v, key, h, s)
        if i < 0:
            return _need(v, T_MASK, s) if not _has_room(v, T_MASK, s) else False
        if _load_u64(_sh(v, T_MASK, S_ADDR, s), 2 * i + 1) & (_ONE << np.uint64(ep)) == _ZERO:
            return False
    h = _pair_hash(key, ep)
    s = _shard_of(h)
    if _pair_slot(v, key, ep, h, s) >= 0:
        return False
    return _need(v, T_PAIR, s) if not _has_room(v, T_PAIR, s) else False


@_helper
def _holder_add(v: View, key: Any, ep: Any) -> None:
    if ep < LOW_ENDPOINTS:
        bit = _ONE << np.uint64(ep)
        h = _mix(key)
        s = _shard_of(h)
        addr = _sh(v, T_MASK, S_ADDR, s)
        i = _mask_slot(v, key, h, s)
        if i < 0:
            _word_put(addr, _sh(v, T_MASK, S_SLOTS, s), h, key, bit)
            _sh_add(v, T_MASK, S_COUNT, s, 1)
            return
        held = _load_u64(addr, 2 * i + 1)
        if held & bit == _ZERO:
            _store_u64(addr, 2 * i + 1, held | bit)
            return
    _pair_inc(v, key, ep)


@_helper
def _holder_remove(v: View, key: Any, ep: Any) -> None:
    if _pair_dec(v, key, ep) or ep >= LOW_ENDPOINTS:
        return
    h = _mix(key)
    s = _shard_of(h)
    i = _mask_slot(v, key, h, s)
    addr = _sh(v, T_MASK, S_ADDR, s)
    held = _load_u64(addr, 2 * i + 1) & ~(_ONE << np.uint64(ep))
    if held == _ZERO:
        _word_delete(v, T_MASK, s, i)
    else:
        _store_u64(addr, 2 * i + 1, held)


# --- per-endpoint LRU lists (oldest at the head) ------------------------------------------------------------


@_helper
def _unlink(v: View, ep: Any, n: Any) -> None:
    p = _nprev(v, n)
    x = _nnext(v, n)
    if p >= 0:
        _set_i32(v, N_NEXT, p, x)
    else:
        _ep_set(v, ep, E_HEAD, x)
    if x >= 0:
        _set_i32(v, N_PREV, x, p)
    else:
        _ep_set(v, ep, E_TAIL, p)


@_helper
def _append(v: View, ep: Any, n: Any) -> None:
    t = _ep(v, ep, E_TAIL)
    _set_i32(v, N_PREV, n, t)
    _set_i32(v, N_NEXT, n, -1)
    if t >= 0:
        _set_i32(v, N_NEXT, t, n)
    else:
        _ep_set(v, ep, E_HEAD, n)
    _ep_set(v, ep, E_TAIL, n)


@_helper
def _drop(v: View, ep: Any, n: Any) -> None:
    _unlink(v, ep, n)
    _entry_delete(v, n)
    _holder_remove(v, _nval(v, n), ep)
    _node_free(v, n)
    _ep_set(v, ep, E_SIZE, _ep(v, ep, E_SIZE) - 1)
    _g_set(v, G_USED, _g(v, G_USED) - 1)


# --- warming: independent loads first, so that a batch's cache misses overlap -------------------------------


@_helper
def _warm_key(v: View, key: Any, ep: Any, val: Any) -> Any:
    """Load the lines that inserting or refreshing (key, ep) will touch; returns them XOR-ed (kept live)."""
    sink = _ZERO
    h = _pair_hash(key, ep)
    s = _shard_of(h)
    slots = _sh(v, T_ENTRY, S_SLOTS, s)
    if slots:
        x = np.int64(_load_i32(_sh(v, T_ENTRY, S_ADDR, s), _home(h, slots)))
        if x > 0:
            sink ^= _nkey(v, x - 1) ^ np.uint64(_nep(v, x - 1))
    h = _mix(val)
    s = _shard_of(h)
    slots = _sh(v, T_MASK, S_SLOTS, s)
    if slots:
        sink ^= _load_u64(_sh(v, T_MASK, S_ADDR, s), 2 * _home(h, slots))
    return sink


# --- kernels called from Python -----------------------------------------------------------------------------


@_kernel
def touch(c: Core, ep: int, keys: U64, vals: U64, start: int) -> int:
    """Insert or refresh ``ep``'s entries for ``keys`` (router hashes ``vals``), last key first.

    Refreshing moves an entry to the fresh end of the LRU list; the first key ends freshest. Returns how many
    keys are done: ``len(keys)``, or less when something must grow first (see ``g``), to be called again from
    there. Evicts nothing: the caller calls :func:`evict` once the chain is in.
    """
    v = _view(c)
    count: int = keys.shape[0]
    with_val = _g(v, G_WITH_VAL) != 0
    sink = _ZERO
    for i in range(start, count):
        if i % WARM_BATCH == start % WARM_BATCH:  # warm the next batch (a resumed call warms from there)
            for j in range(count - 1 - min(count, i + WARM_BATCH) + 1, count - i):
                sink ^= _warm_key(v, keys[j], ep, vals[j] if with_val else keys[j])
            _g_set(v, G_SINK, np.int64(sink & _LOW32))
        key = keys[count - 1 - i]
        val = vals[count - 1 - i] if with_val else key
        n = _entry_find(v, key, ep)
        if n >= 0:
            if with_val and _nval(v, n) != val:
                if _holder_missing(v, val, ep):
                    return i
                _holder_remove(v, _nval(v, n), ep)
                _set_u64(v, N_VAL, n, val)
                _holder_add(v, val, ep)
            _unlink(v, ep, n)
            _append(v, ep, n)
            continue
        if _node_missing(v):
            _need(v, T_NODES, 0)
            return i
        s = _shard_of(_pair_hash(key, ep))
        if not _has_room(v, T_ENTRY, s):
            _need(v, T_ENTRY, s)
            return i
        if _holder_missing(v, val, ep):
            return i
        n = _node_alloc(v)
        _set_u64(v, N_KEY, n, key)
        if with_val:
            _set_u64(v, N_VAL, n, val)
        _set_i32(v, N_EP, n, ep)
        _entry_insert(v, n)
        _holder_add(v, val, ep)
        _append(v, ep, n)
        _ep_set(v, ep, E_SIZE, _ep(v, ep, E_SIZE) + 1)
        _g_set(v, G_USED, _g(v, G_USED) + 1)
    return count


@_kernel
def evict(c: Core, ep: int, limit: int, budget: int) -> int:
    """Drop ``ep``'s oldest entries until it holds at most ``limit`` or ``budget`` are gone; how many went."""
    v = _view(c)
    todo = min(_ep(v, ep, E_SIZE) - limit, budget)
    if todo <= 0:
        return 0
    victims = np.empty(min(todo, EVICT_BATCH), np.int64)
    dropped = 0
    while dropped < todo:
        batch = min(todo - dropped, victims.shape[0])
        n = _ep(v, ep, E_HEAD)
        sink = _ZERO
        for i in range(batch):  # the oldest first (one miss per node), then all their lines at once
            victims[i] = n
            n = _nnext(v, n)
        for i in range(batch):
            n = victims[i]
            sink ^= _warm_key(v, _nkey(v, n), ep, _nval(v, n)) ^ np.uint64(_nprev(v, n))
        _g_set(v, G_SINK, np.int64(sink & _LOW32))
        for i in range(batch):
            _drop(v, ep, victims[i])
        dropped += batch
    return dropped


@_kernel
def remove(c: Core, ep: int, keys: U64) -> int:
    """Drop ``ep``'s entries for ``keys``; how many were there."""
    v = _view(c)
    removed = 0
    for i in range(keys.shape[0]):
        n = _entry_find(v, keys[i], ep)
        if n >= 0:
            _drop(v, ep, n)
            removed += 1
    return removed


@_kernel
def find(c: Core, ep: int, key: Any, out: U64) -> bool:
    """Whether ``ep`` holds ``key``; if so its router hash goes to ``out[0]``."""
    v = _view(c)
    n = _entry_find(v, key, ep)
    if n < 0:
        return False
    out[0] = _nval(v, n)
    return True


@_helper
def _bit_index(bit: Any) -> Any:
    """The index of the single set bit of ``bit``."""
    index = 0
    if bit & np.uint64(0xFFFFFFFF00000000) != _ZERO:
        index += 32
    if bit & np.uint64(0xFFFF0000FFFF0000) != _ZERO:
        index += 16
    if bit & np.uint64(0xFF00FF00FF00FF00) != _ZERO:
        index += 8
    if bit & np.uint64(0xF0F0F0F0F0F0F0F0) != _ZERO:
        index += 4
    if bit & np.uint64(0xCCCCCCCCCCCCCCCC) != _ZERO:
        index += 2
    if bit & np.uint64(0xAAAAAAAAAAAAAAAA) != _ZERO:
        index += 1
    return index


@_kernel
def match(c: Core, hashes: U64, eps: I64, out: I64) -> None:
    """``out[j]``: how many of ``hashes`` endpoint ``eps[j]`` holds contiguously from the first (0 if -1)."""
    v = _view(c)
    depth_of_bit = np.zeros(LOW_ENDPOINTS, np.int64)
    alive = _ZERO
    high = np.empty(eps.shape[0], np.int64)
    high_alive = 0
    for j in range(eps.shape[0]):
        out[j] = 0
        if 0 <= eps[j] < LOW_ENDPOINTS:
            alive |= _ONE << np.uint64(eps[j])
        elif eps[j] >= LOW_ENDPOINTS:
            high[high_alive] = j
            high_alive += 1
    depth = 0
    for d in range(hashes.shape[0]):
        if alive == _ZERO and high_alive == 0:
            break
        key = hashes[d]
        if alive != _ZERO:
            kept = alive & _mask_get(v, key)
            gone = alive & ~kept
            while gone != _ZERO:  # endpoints that stop here matched d blocks
                bit = gone & (~gone + _ONE)
                depth_of_bit[_bit_index(bit)] = d
                gone ^= bit
            alive = kept
        k = 0
        while k < high_alive:
            j = high[k]
            if _pair_held(v, key, eps[j]):
                k += 1
            else:
                out[j] = d
                high_alive -= 1
                high[k] = high[high_alive]
        depth = d + 1
    for k in range(high_alive):
        out[high[k]] = depth
    for j in range(eps.shape[0]):
        if 0 <= eps[j] < LOW_ENDPOINTS:
            bit = _ONE << np.uint64(eps[j])
            out[j] = depth if alive & bit != _ZERO else depth_of_bit[eps[j]]


@_kernel
def rehash(c: Core, table: int, s: int, addr: int, slots: int) -> None:
    """Copy shard ``s`` of ``table`` (not its tombstones) into the empty ``slots``-slot array at ``addr``.

    The caller then swaps the arrays and zeroes the shard's tombstone count.
    """
    v = _view(c)
    old = _sh(v, table, S_ADDR, s)
    for i in range(_sh(v, table, S_SLOTS, s)):
        if table == T_ENTRY:
            x = np.int64(_load_i32(old, i))
            if x > 0:
                _entry_put(addr, slots, _pair_hash(_nkey(v, x - 1), _nep(v, x - 1)), x - 1)
        else:
            aux = _load_u64(old, 2 * i + 1)
            if aux != _ZERO:
                key = _load_u64(old, 2 * i)
                _word_put(addr, slots, _word_hash(table, key, aux), key, aux)
