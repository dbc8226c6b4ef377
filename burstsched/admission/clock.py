"""Clocks for the admission window: the event loop's, and a manual one for tests."""

from __future__ import annotations

import asyncio
from typing import Protocol

import anyio
import anyio.lowlevel


class Clock(Protocol):
    """Monotonic time in seconds and a sleep until a point in that time."""

    def now(self) -> float:
        """The current time, in seconds."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Return once ``now() >= deadline``."""
        ...


class LoopClock:
    """The event loop's monotonic clock (the router runs on asyncio: uvicorn, aiohttp).

    ``loop.time()`` directly: ``anyio.current_time()`` looks the async library up on every call, and admission
    reads the clock several times per request.
    """

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep_until(self, deadline: float) -> None:
        await anyio.sleep_until(deadline)


class ManualClock:
    """A clock that only moves when told to; sleepers wake when ``advance`` passes their deadline."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, anyio.Event]] = []

    def now(self) -> float:
        return self._now

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        event = anyio.Event()
        entry = (deadline, event)
        self._sleepers.append(entry)
        try:
            await event.wait()
        finally:
            if entry in self._sleepers:
                self._sleepers.remove(entry)

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has come."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._now += seconds
        due = [entry for entry in self._sleepers if entry[0] <= self._now]
        for entry in due:
            self._sleepers.remove(entry)
            entry[1].set()

    @property
    def sleepers(self) -> int:
        """How many tasks are sleeping on this clock."""
        return len(self._sleepers)
