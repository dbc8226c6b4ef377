"""Graceful shutdown: stop taking requests, let in-flight ones finish up to a deadline, then end them.

The app owns one :class:`Drainer`. The front's ``RefuseWhileDraining`` (the app's outermost middleware)
counts the HTTP requests inside the app;
the dispatcher registers each request it proxies with an abort callback.
``burstsched serve`` calls :meth:`Drainer.drain` when it starts shutting down (uvicorn has closed the
listening sockets by then): it waits until no request is left, up to its deadline, then aborts every
registered request (and any that reaches the dispatcher later): the dispatcher ends a stream with an OpenAI
error event and ``[DONE]``, and answers a request that has no response yet with 503. While draining, new
requests on still-open connections get 503 at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

log = logging.getLogger(__name__)

Abort = Callable[[], None]


class Drainer:
    """The in-flight requests of one app, and whether it is shutting down."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._draining = False
        self._aborting = False
        self._active = 0
        self._aborts: dict[int, Abort] = {}
        self._next = 0
        self._idle: anyio.Event | None = None

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def in_flight(self) -> int:
        """HTTP requests inside the app now."""
        return self._active

    def request_started(self) -> None:
        self._active += 1

    def request_finished(self) -> None:
        self._active -= 1
        if self._active == 0 and self._idle is not None:
            self._idle.set()

    def register(self, abort: Abort) -> Callable[[], None]:
        """Make a running request abortable; returns the function to call once it is over. Past the drain
        deadline, ``abort`` runs at once."""
        if self._aborting:
            abort()
        key = self._next
        self._next += 1
        self._aborts[key] = abort

        def done() -> None:
            self._aborts.pop(key, None)

        return done

    def abort_all(self) -> int:
        """Abort every request in flight; how many there were."""
        aborts = list(self._aborts.values())
        for abort in aborts:
            abort()
        return len(aborts)

    async def drain(self) -> None:
        """Refuse new requests, wait up to ``timeout_s`` for the running ones, then abort the rest."""
        self._draining = True
        if self._active:
            self._idle = anyio.Event()
            log.info("draining %d in-flight request(s) for up to %.1f s", self._active, self.timeout_s)
            with anyio.move_on_after(self.timeout_s):
                await self._idle.wait()
        self._aborting = True
        aborted = self.abort_all()
        if aborted:
            log.warning("shutdown deadline reached: aborted %d request(s)", aborted)
