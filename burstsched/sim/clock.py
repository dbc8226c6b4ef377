"""Time for the simulator, injected so tests can run the engine on a virtual clock."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic seconds, and a way to wait until a point in them."""

    def now(self) -> float: ...

    async def sleep_until(self, deadline: float) -> None: ...


class RealClock:
    """The process's monotonic clock and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))


class VirtualClock:
    """A clock that jumps to each deadline at once (still yielding to the loop): for unit tests."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    async def sleep_until(self, deadline: float) -> None:
        self._now = max(self._now, deadline)
        await asyncio.sleep(0)
