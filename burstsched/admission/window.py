"""The admission window: hold cold requests a few milliseconds so a burst is placed together.

The first request that does not bypass opens a window; the window seals ``window_s`` later (by the injected
clock) or as soon as it holds ``max_batch`` requests. A sealed window goes to the ``place`` callback as one
``Batch``; each waiter then gets its own result, or the exception placement raised. A waiter cancelled before
its window seals leaves it; one cancelled later is still placed, and its result is dropped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Generic, TypeVar, cast

import anyio
import anyio.abc

from burstsched.admission.clock import Clock, LoopClock
from burstsched.admission.errors import AdmissionClosed, AdmissionError, AdmissionQueueFull

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Batch(Generic[T]):
    """A sealed window: its requests under their tickets, in arrival order."""

    window_id: int
    opened_at: float
    sealed_at: float
    entries: tuple[tuple[str, T], ...]
    bypass: bool = False


@dataclass(eq=False, slots=True)
class _Waiter(Generic[T, R]):
    ticket: str
    item: T
    done: anyio.Event = field(default_factory=anyio.Event)
    result: R | None = None
    error: BaseException | None = None
    error_tb: TracebackType | None = None
    resolved: bool = False

    def resolve(self, result: R) -> None:
        self.result, self.resolved = result, True
        self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error, self.error_tb, self.resolved = error, error.__traceback__, True
        self.done.set()

    def outcome(self) -> R:
        if self.error is not None:
            raise self.error.with_traceback(self.error_tb)
        if not self.resolved:
            raise AdmissionError("window closed before this request was placed")
        return cast(R, self.result)


@dataclass(eq=False, slots=True)
class _Open(Generic[T, R]):
    window_id: int
    opened_at: float
    deadline: float
    waiters: list[_Waiter[T, R]] = field(default_factory=list)
    sealed: bool = False
    sealed_at: float = 0.0
    timer: anyio.CancelScope | None = None


Place = Callable[[Batch[T]], Awaitable[Mapping[str, R]]]


class AdmissionWindow(Generic[T, R]):
    """Collects requests into windows and hands each sealed window to ``place``; use as an async context."""

    def __init__(
        self,
        place: Place[T, R],
        *,
        window_s: float,
        max_batch: int,
        queue_limit: int,
        retry_after_s: int = 1,
        bypass: Callable[[T], bool] | None = None,
        clock: Clock | None = None,
    ) -> None:
        if window_s <= 0 or max_batch < 1 or queue_limit < 1:
            raise ValueError("window_s must be positive, max_batch and queue_limit at least 1")
        self._place = place
        self._window_s = window_s
        self._max_batch = max_batch
        self._queue_limit = queue_limit
        self._retry_after_s = retry_after_s
        self._bypass = bypass
        self._clock: Clock = clock or LoopClock()
        self._tasks: anyio.abc.TaskGroup | None = None
        self._current: _Open[T, R] | None = None
        self._held = 0
        self._next_window = 0
        self._next_ticket = 0

    def configure(self, *, window_s: float, max_batch: int, queue_limit: int, retry_after_s: int) -> None:
        """New settings for the windows opened from now on (a live config reload); the one collecting now
        keeps its deadline, and seals at the new ``max_batch``."""
        if window_s <= 0 or max_batch < 1 or queue_limit < 1:
            raise ValueError("window_s must be positive, max_batch and queue_limit at least 1")
        self._window_s = window_s
        self._max_batch = max_batch
        self._queue_limit = queue_limit
        self._retry_after_s = retry_after_s

    @property
    def held(self) -> int:
        """Requests waiting in a window or being placed."""
        return self._held

    @property
    def open_window(self) -> int | None:
        """The id of the window now collecting requests, if one is."""
        return self._current.window_id if self._current is not None else None

    async def __aenter__(self) -> AdmissionWindow[T, R]:
        tasks = anyio.create_task_group()
        await tasks.__aenter__()
        self._tasks = tasks
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        tasks, self._tasks = self._tasks, None
        if tasks is None:
            raise AdmissionClosed("admission window was not entered")
        if self._current is not None:
            self._seal(self._current, tasks)
        return await tasks.__aexit__(exc_type, exc, tb)

    async def submit(self, item: T) -> R:
        """Wait for ``item``'s window to be placed and return its result (or raise placement's error)."""
        tasks = self._tasks
        if tasks is None:
            raise AdmissionClosed("admission window is not running")
        if self._bypass is not None and self._bypass(item):
            return await self._place_now(item)
        if self._held >= self._queue_limit:
            raise AdmissionQueueFull(self._queue_limit, self._retry_after_s)
        window = self._current if self._current is not None else self._open(tasks)
        waiter: _Waiter[T, R] = _Waiter(self._ticket(), item)
        window.waiters.append(waiter)
        self._held += 1
        try:
            if len(window.waiters) >= self._max_batch:
                self._seal(window, tasks)
            await waiter.done.wait()
        except BaseException:
            if not window.sealed:
                self._leave(window, waiter)
            raise
        finally:
            self._held -= 1
        return waiter.outcome()

    async def _place_now(self, item: T) -> R:
        now = self._clock.now()
        ticket = self._ticket()
        batch = Batch(self._window_ids(), now, now, ((ticket, item),), bypass=True)
        results = await self._place(batch)
        if ticket not in results:
            raise AdmissionError("placement returned no decision for a bypassing request")
        return results[ticket]

    def _ticket(self) -> str:
        self._next_ticket += 1
        return str(self._next_ticket)

    def _window_ids(self) -> int:
        self._next_window += 1
        return self._next_window

    def _open(self, tasks: anyio.abc.TaskGroup) -> _Open[T, R]:
        now = self._clock.now()
        window: _Open[T, R] = _Open(self._window_ids(), now, now + self._window_s)
        self._current = window
        tasks.start_soon(self._expire, window, tasks)
        return window

    async def _expire(self, window: _Open[T, R], tasks: anyio.abc.TaskGroup) -> None:
        if window.sealed:
            return
        with anyio.CancelScope() as scope:
            window.timer = scope
            await self._clock.sleep_until(window.deadline)
            self._seal(window, tasks)

    def _leave(self, window: _Open[T, R], waiter: _Waiter[T, R]) -> None:
        window.waiters.remove(waiter)
        if not window.waiters:
            self._close(window)

    def _close(self, window: _Open[T, R]) -> None:
        window.sealed = True
        if self._current is window:
            self._current = None
        if window.timer is not None:
            window.timer.cancel()

    def _seal(self, window: _Open[T, R], tasks: anyio.abc.TaskGroup) -> None:
        if window.sealed:
            return
        self._close(window)
        window.sealed_at = self._clock.now()
        if window.waiters:
            tasks.start_soon(self._run_place, window)

    async def _run_place(self, window: _Open[T, R]) -> None:
        waiters = list(window.waiters)
        batch = Batch(
            window.window_id,
            window.opened_at,
            window.sealed_at,
            tuple((waiter.ticket, waiter.item) for waiter in waiters),
        )
        try:
            results = await self._place(batch)
        except Exception as error:
            for waiter in waiters:
                waiter.fail(error)
            return
        except BaseException:
            for waiter in waiters:
                waiter.fail(AdmissionClosed("admission window closed during placement"))
            raise
        for waiter in waiters:
            if waiter.ticket in results:
                waiter.resolve(results[waiter.ticket])
            else:
                waiter.fail(AdmissionError("placement returned no decision for a request"))
