"""A replica whose ``/metrics`` hangs goes stale, and the router keeps serving: scoring falls back to its own
in-flight counts, on the simulator."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from burstsched.config import PoolConfig
from burstsched.server.serve import RunningRouter, running_router
from burstsched.sim import Faults, SimConfig, SimPool

from .helpers import config_for, eventually

pytestmark = pytest.mark.anyio

POOL = PoolConfig(
    scrape_interval_ms=20, staleness_threshold_ms=200, scrape_timeout_ms=100, health_check_interval_ms=100
)


@pytest.fixture
async def sim_pool() -> AsyncIterator[SimPool]:
    async with SimPool(2, SimConfig(time_scale=0.02)) as pool:
        yield pool


@pytest.fixture
async def router(sim_pool: SimPool) -> AsyncIterator[RunningRouter]:
    config = config_for(list(zip(sim_pool.names, sim_pool.urls, strict=True)), pool=POOL)
    async with running_router(config) as running:
        yield running


async def test_dead_metrics_make_an_endpoint_stale_not_unavailable(
    sim_pool: SimPool, router: RunningRouter
) -> None:
    pool = router.app.state.router.pool
    dead = sim_pool.names[0]
    await sim_pool.aset_faults(0, Faults(metrics_dead=True))

    async def stale() -> bool:
        return bool(pool.snapshot(dead).stale)

    await eventually(stale)
    served: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:

        async def ask(i: int) -> None:
            body = {
                "model": "kv-demo",
                "messages": [{"role": "user", "content": f"q{i} " * 40}],
                "max_tokens": 4,
            }
            response = await client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200
            name = response.headers["x-burstsched-endpoint"]
            served[name] = served.get(name, 0) + 1

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for i in range(12):
                    tg.start_soon(ask, i)
        metrics = (await client.get("/metrics")).text
    assert sum(served.values()) == 12
    assert served.get(dead, 0) > 0 and len(served) == 2  # still used: stale, not dropped
    assert pool.snapshot(dead).healthy and pool.snapshot(dead).stale
    assert f'burstsched_endpoint_stale{{endpoint="{dead}"}} 1.0' in metrics

    await sim_pool.aset_faults(0, Faults())

    async def fresh() -> bool:
        return not pool.snapshot(dead).stale

    await eventually(fresh)
