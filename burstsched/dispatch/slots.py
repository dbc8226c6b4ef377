"""The cap on upstream requests in flight at once, with a wait bounded by the pool timeout.

One slot is held from sending a request until its response is closed. A request that finds every slot
taken waits in line (first come, first served); a freed slot passes straight to the first waiter. A wait
longer than the pool timeout raises ``httpx.PoolTimeout``, which the dispatcher tells apart from a connect
timeout (a busy router, not an unreachable replica).
"""

from __future__ import annotations

import asyncio
from collections import deque

import httpx


class RequestSlots:
    """At most ``limit`` slots taken at once."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the limit must be at least 1")
        self._limit = limit
        self._taken = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def taken(self) -> int:
        return self._taken

    @property
    def waiting(self) -> int:
        return sum(1 for waiter in self._waiters if not waiter.done())

    async def acquire(self, timeout_s: float | None) -> None:
        """Take a slot, waiting at most ``timeout_s`` (None: no limit) for one to be freed."""
        if self._taken < self._limit and not self._waiters:
            self._taken += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot was handed over as the wait ended: pass it on
            elif waiter in self._waiters:  # a freed slot may have skipped it already
                self._waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise httpx.PoolTimeout(f"no free upstream connection within {timeout_s} s") from None
            raise

    def release(self) -> None:
        """Give a slot back: to the first waiter in line, else to the pool."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the waiter: the count stays
                return
        self._taken -= 1
