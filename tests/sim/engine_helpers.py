"""Helpers for engine tests: an engine on a virtual clock, requests, and running them to completion."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import anyio
import anyio.lowlevel

from burstsched.prefix.kv_events import KVEvent
from burstsched.sim.clock import VirtualClock
from burstsched.sim.cost_model import CostModel
from burstsched.sim.engine import Engine, EngineLimits, EngineRequest, NullStats


class FixedTokens:
    """Always the same output token."""

    def __init__(self, token_id: int = 7, text: str = " x") -> None:
        self._token = (token_id, text)

    def next_token(self) -> tuple[int, str]:
        return self._token


@dataclass
class RecordingStats(NullStats):
    queries: int = 0
    hits: int = 0
    preemptions: int = 0
    finished_ids: list[str] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)

    def prefix_cache_lookup(self, queries: int, hits: int) -> None:
        self.queries += queries
        self.hits += hits

    def preemption(self) -> None:
        self.preemptions += 1

    def finished(self, req: EngineRequest) -> None:
        self.finished_ids.append(req.request_id)

    def step(self, num_tokens: int) -> None:
        self.step_tokens.append(num_tokens)


@dataclass
class EngineHarness:
    engine: Engine
    clock: VirtualClock
    stats: RecordingStats
    events: list[KVEvent]

    def request(
        self,
        rid: str,
        prompt: Sequence[int],
        max_tokens: int = 4,
        *,
        salt: str | None = None,
        priority: int = 0,
    ) -> EngineRequest:
        return EngineRequest(
            rid,
            list(prompt),
            max_tokens,
            FixedTokens(),
            cache_salt=salt,
            arrival_time=self.clock.now(),
            priority=priority,
        )

    def add(self, *reqs: EngineRequest) -> None:
        for req in reqs:
            self.engine.add_request(req)

    async def finish(self, *reqs: EngineRequest) -> None:
        """Wait (bounded) until every request has its final event."""
        with anyio.fail_after(10):
            for req in reqs:
                while (await req.events.get()).finish_reason is None:
                    pass


@contextlib.asynccontextmanager
async def running_engine(
    *,
    block_size: int = 4,
    num_gpu_blocks: int = 64,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 64,
    max_waiting_requests: int = 0,
    enable_prefix_caching: bool = True,
    cost: CostModel | None = None,
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs",
) -> AsyncIterator[EngineHarness]:
    clock = VirtualClock()
    stats = RecordingStats()
    events: list[KVEvent] = []
    limits = EngineLimits(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_waiting_requests=max_waiting_requests,
        enable_prefix_caching=enable_prefix_caching,
        scheduling_policy=scheduling_policy,
    )
    engine = Engine(limits, cost or CostModel(), clock=clock, stats=stats, event_sink=events.extend)
    task = asyncio.create_task(engine.run())
    try:
        yield EngineHarness(engine, clock, stats, events)
    finally:
        engine.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def tokens(start: int, n: int) -> list[int]:
    """``n`` distinct token ids from ``start``."""
    return list(range(start, start + n))


async def wait_until(predicate: Callable[[], bool], limit_s: float = 5.0) -> None:
    """Yield to the loop until ``predicate()`` holds (bounded)."""
    with anyio.fail_after(limit_s):
        while not predicate():
            await anyio.lowlevel.checkpoint()
