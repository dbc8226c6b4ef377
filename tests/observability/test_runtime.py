"""The router's runtime gauges: the event-loop lag sampler (on a manual clock), the families it exports, and
their life in a real router (sampling while it serves, gone when its lifespan ends)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from burstsched.config import EndpointConfig, PoolConfig, RouterConfig
from burstsched.server.serve import running_router
from burstsched.sim import SimConfig, SimPool
from burstsched.telemetry.runtime import LoopLagSampler, RuntimeMetrics

GOLDEN = Path(__file__).parent / "golden"
HAS_PROC = Path("/proc/self/stat").exists()


class ManualTime:
    """A clock and a sleep: each sleep moves the clock by what was asked plus the next of ``lates``; once
    they are used up, sleeps block (until the test cancels) and ``drained`` is set."""

    def __init__(self, lates: list[float]) -> None:
        self.now = 100.0
        self.lates = list(lates)
        self.asked: list[float] = []
        self.drained = anyio.Event()

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        if not self.lates:
            self.drained.set()
            await anyio.sleep_forever()
        self.now += seconds + self.lates.pop(0)


async def _run_until_drained(sampler: LoopLagSampler, time: ManualTime) -> None:
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(sampler.run)
            await time.drained.wait()
            tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_the_sampler_observes_how_late_each_sleep_woke() -> None:
    time = ManualTime([0.0, 0.003, 0.25, -0.04])  # the last: a clock that stepped back, no lag
    seen: list[float] = []
    sampler = LoopLagSampler(seen.append, interval_s=0.1, clock=time.clock, sleep=time.sleep)
    await _run_until_drained(sampler, time)
    assert seen == pytest.approx([0.0, 0.003, 0.25, 0.0])
    assert time.asked == [0.1] * 5  # four woke, the fifth was cancelled


def test_the_sampler_wants_a_positive_interval() -> None:
    with pytest.raises(ValueError):
        LoopLagSampler(lambda _: None, interval_s=0)


def _stable(exposition: bytes) -> str:
    lines = exposition.decode().splitlines()
    return "\n".join(line for line in lines if "_created" not in line) + "\n"


@pytest.mark.anyio
async def test_runtime_exposition_after_fixed_samples() -> None:
    time = ManualTime([0.0002, 0.004, 0.004, 0.3])
    registry = CollectorRegistry(auto_describe=True)
    runtime = RuntimeMetrics(
        registry, count_tasks=lambda: 7, clock=time.clock, sleep=time.sleep, process=False
    )
    await _run_until_drained(runtime.sampler, time)
    text = _stable(generate_latest(registry))
    path = GOLDEN / "runtime.txt"
    if os.environ.get("BURSTSCHED_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), "runtime.txt differs (rewrite with BURSTSCHED_UPDATE_GOLDEN=1 if meant)"


@pytest.mark.skipif(not HAS_PROC, reason="the process collector reads /proc")
def test_the_process_family_reads_this_process() -> None:
    registry = CollectorRegistry(auto_describe=True)
    RuntimeMetrics(registry, count_tasks=lambda: 0)
    values = {s.name: s.value for f in registry.collect() for s in f.samples}
    assert values["process_resident_memory_bytes"] > 1_000_000
    assert values["process_open_fds"] == len(os.listdir("/proc/self/fd"))  # both count their listing's fd
    assert values["process_max_fds"] >= values["process_open_fds"]
    assert values["burstsched_asyncio_tasks"] == 0


def _samples(text: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def _sampler_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == "burstsched-loop-lag"]


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_a_router_exports_its_runtime_and_stops_sampling_when_it_stops() -> None:
    pool_config = PoolConfig(scrape_interval_ms=50, staleness_threshold_ms=2000, health_check_interval_ms=200)
    async with SimPool(1, SimConfig(time_scale=0.02)) as sims:
        endpoints = [EndpointConfig(name=n, url=u) for n, u in zip(sims.names, sims.urls, strict=True)]
        config = RouterConfig(endpoints=endpoints, pool=pool_config)
        async with running_router(config) as router, httpx.AsyncClient(timeout=10) as client:
            assert len(_sampler_tasks()) == 1
            with anyio.fail_after(10):
                while True:  # the sampler wakes every 100 ms: wait for its first observations
                    values = _samples((await client.get(f"{router.url}/metrics")).text)
                    if values["burstsched_event_loop_lag_seconds_count"] >= 2:
                        break
                    await anyio.sleep(0.05)
            assert values["burstsched_event_loop_lag_seconds_sum"] >= 0
            # this test's loop serves the router: the sampler, the pool's loops, uvicorn, this test
            assert values["burstsched_asyncio_tasks"] >= 3
            if HAS_PROC:
                assert values["process_resident_memory_bytes"] > 1_000_000
                assert values["process_open_fds"] > 0
        assert _sampler_tasks() == []
