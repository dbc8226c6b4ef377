"""A simulated replica served to callers on the same event loop: its ASGI app, no socket, no ZMQ.

For discrete-event replays (:mod:`burstsched.replay.virtual_run`): requests reach :attr:`app` through an
in-process transport, and each engine step's KV events go to ``event_sink`` as a list, not over ZMQ.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType

from starlette.types import ASGIApp

from burstsched.prefix.kv_events import KVEvent
from burstsched.sim.assembly import ReplicaParts
from burstsched.sim.clock import Clock
from burstsched.sim.config import SimConfig
from burstsched.sim.metrics import SimMetrics
from burstsched.sim.server import build_app


class InProcessReplica:
    """One replica's engine and endpoints; ``async with`` runs its engine."""

    def __init__(
        self,
        config: SimConfig,
        *,
        name: str,
        clock: Clock,
        event_sink: Callable[[list[KVEvent]], None] | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self._state = ReplicaParts.build(config).assemble(name, clock, event_sink=event_sink)
        self.app: ASGIApp = build_app(self._state)
        self._engine_task: asyncio.Task[None] | None = None

    @property
    def metrics(self) -> SimMetrics:
        return self._state.metrics

    async def __aenter__(self) -> InProcessReplica:
        self._engine_task = asyncio.create_task(self._state.engine.run(), name=f"{self.name}-engine")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._state.engine.close()
        task = self._engine_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
