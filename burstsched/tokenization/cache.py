"""A bounded LRU of prompt token ids, keyed by a digest of what decides them, shared by concurrent callers.

Clients resend the same conversation prefix and bursts carry identical prompts, so the router tokenizes
the same request body again and again. Entries are compact (``array('I')``, 4 bytes a token), so 8192
entries of 5000 tokens stay near 160 MiB; the bound is the number of entries. Concurrent callers asking for
the same key while it is being computed wait for that one computation (a burst of identical prompts is
tokenized once); if it fails they get its error, if it is cancelled one of them computes it again.
Not thread-safe: use it from one event loop.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

import anyio


class _Pending:
    """A computation in progress that other callers wait for."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: tuple[int, ...] | None = None
        self.error: Exception | None = None


class PromptCache:
    """LRU of ``key -> token ids`` holding at most ``max_entries`` (0: nothing is kept)."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[bytes, array[int]] = OrderedDict()
        self._pending: dict[bytes, _Pending] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> tuple[int, ...] | None:
        """The ids stored under ``key`` (now most recently used), or None."""
        ids = self._entries.get(key)
        if ids is None:
            return None
        self._entries.move_to_end(key)
        return tuple(ids)

    def put(self, key: bytes, ids: Sequence[int]) -> None:
        """Store ``ids`` under ``key``, evicting the least recently used entry past the bound."""
        if self.max_entries == 0:
            return
        self._entries[key] = array("I", ids)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def get_or_compute(
        self, key: bytes, compute: Callable[[], Awaitable[tuple[int, ...]]]
    ) -> tuple[int, ...]:
        """The cached ids of ``key``, else ``compute()``'s (stored), computed once for concurrent callers."""
        while True:
            cached = self.get(key)
            if cached is not None:
                self.hits += 1
                return cached
            pending = self._pending.get(key)
            if pending is None:
                break
            await pending.done.wait()
            if pending.error is not None:
                raise pending.error
            if pending.result is not None:
                self.hits += 1
                return pending.result
            # the computing caller was cancelled: loop, and compute it here if nobody else does
        self.misses += 1
        pending = _Pending()
        self._pending[key] = pending
        try:
            ids = await compute()
        except Exception as exc:
            pending.error = exc
            raise
        else:
            pending.result = ids
            self.put(key, ids)
            return ids
        finally:
            del self._pending[key]
            pending.done.set()
