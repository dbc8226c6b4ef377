"""An asyncio event loop on virtual time: when nothing is ready to run, the clock jumps to the next timer.

A replay on this loop is a discrete-event simulation: the simulated replicas' prefill and decode steps, the
admission window, scrapes and the arrivals are all timers, so the loop runs them in time order as fast as the
CPU allows, however long the trace. Code between two instants costs no virtual time (the router's own CPU is
not counted), and the run is deterministic for a given input.

The loop still watches its file descriptors (its self-pipe at least): before any jump it polls them without
waiting, and while work handed to a thread through :meth:`run_in_executor` is pending it waits for real
instead of jumping, so a thread's result lands at the virtual instant it was asked for. Code that starts
threads some other way, or waits on sockets, would see time jump past it: an in-process replay keeps to
in-memory I/O (:mod:`burstsched.replay.asgi_io`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_REAL_WAIT_S = 0.05
"""How long one real wait for a pending thread lasts before the loop looks at its timers again."""


class _JumpingSelector(selectors.DefaultSelector):
    """The platform's selector; a wait that would find nothing jumps the loop's clock instead."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        loop = self.loop
        if ready or timeout == 0 or loop is None:
            return ready
        if loop.threads_pending:  # a thread will answer through the self-pipe: wait for it for real
            return super().select(_REAL_WAIT_S if timeout is None else min(timeout, _REAL_WAIT_S))
        if timeout is None:  # no timer at all: only I/O can wake the loop
            return super().select(None)
        loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """``loop.time()`` reads a virtual clock that starts at ``start`` and moves only when the loop is idle."""

    def __init__(self, start: float = 0.0) -> None:
        selector = _JumpingSelector()
        self._virtual_now = start
        self.threads_pending = 0
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Move the clock on by ``seconds`` (never back)."""
        if seconds > 0:
            self._virtual_now += seconds

    def run_in_executor(  # type: ignore[override]
        self, executor: concurrent.futures.Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self.threads_pending += 1
        future.add_done_callback(self._thread_done)
        return future

    def _thread_done(self, _: asyncio.Future[Any]) -> None:
        self.threads_pending -= 1


def run_virtual(main: Callable[[], Coroutine[Any, Any, T]], *, start: float = 0.0) -> T:
    """Run the coroutine function ``main`` to completion on a fresh :class:`VirtualTimeLoop`."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        return runner.run(main())
