"""The router process's health on ``/metrics``: event-loop lag, asyncio tasks, memory and file descriptors.

- ``burstsched_event_loop_lag_seconds`` (histogram): how late the :class:`LoopLagSampler` woke from a sleep
  of a fixed interval. A loop busy with other work (a long callback, a blocking call) wakes it late; an idle
  loop wakes it within a fraction of a millisecond.
- ``burstsched_asyncio_tasks`` (gauge): the event loop's live tasks, counted at each scrape. Every request
  in flight holds a few; a count that grows while the load stays level is a task leak.
- ``process_*`` (prometheus_client's process collector, read from ``/proc/self`` at each scrape; absent on
  systems without ``/proc``): resident memory (``process_resident_memory_bytes``), open file descriptors
  (``process_open_fds``), CPU seconds, start time.

The app's lifespan builds :class:`RuntimeMetrics` on the router's registry and runs the sampler in its task
group, so both end with the app.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable

import anyio
from anyio.abc import TaskStatus
from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

LAG_INTERVAL_S = 0.1
LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class LoopLagSampler:
    """Sleeps ``interval_s`` again and again; each time, observes how much later than asked it woke.

    ``clock`` (seconds, monotonic) and ``sleep`` are injected: the event loop's own in service, a manual
    pair in tests. A clock that runs backwards counts as no lag.
    """

    def __init__(
        self,
        observe: Callable[[float], None],
        *,
        interval_s: float = LAG_INTERVAL_S,
        clock: Clock = time.monotonic,
        sleep: Sleep = anyio.sleep,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = interval_s
        self._observe = observe
        self._clock = clock
        self._sleep = sleep

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Sample until cancelled."""
        task_status.started()
        while True:
            asked_at = self._clock()
            await self._sleep(self.interval_s)
            self._observe(max(0.0, self._clock() - asked_at - self.interval_s))


class _TaskCountCollector(Collector):
    """The event loop's live task count, read at scrape time."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count

    def collect(self) -> Iterable[Metric]:
        tasks = GaugeMetricFamily(
            "burstsched_asyncio_tasks", "Live asyncio tasks in the router's event loop, at scrape time."
        )
        tasks.add_metric([], float(self._count()))
        return [tasks]


class RuntimeMetrics:
    """The runtime families, registered on ``registry``; :attr:`sampler` feeds the lag histogram.

    ``count_tasks`` returns the loop's live tasks (called at each scrape, on the loop's thread);
    ``process``: also register prometheus_client's process collector (``process_*``), which reads ``proc``.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        count_tasks: Callable[[], int],
        interval_s: float = LAG_INTERVAL_S,
        clock: Clock = time.monotonic,
        sleep: Sleep = anyio.sleep,
        process: bool = True,
        proc: str = "/proc",
    ) -> None:
        self.loop_lag = Histogram(
            "burstsched_event_loop_lag_seconds",
            f"How much later than asked a task sleeping {interval_s:g} s at a time woke (event-loop lag).",
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        registry.register(_TaskCountCollector(count_tasks))
        if process:
            ProcessCollector(proc=proc, registry=registry)
        self.sampler = LoopLagSampler(self.loop_lag.observe, interval_s=interval_s, clock=clock, sleep=sleep)
