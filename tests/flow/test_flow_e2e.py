"""Flow control end to end: a real router holding requests in front of a simulated replica.

One replica with room for one request in prefill at a time: low-priority requests sent first queue behind
the one in prefill; high-priority ones sent after them reach the replica before the rest of the low ones;
a sheddable request is refused with 429 while the queue holds requests; nothing is lost, and the queue shows
on ``/admin/queue`` and ``/metrics``.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from burstsched.config import FlowControlConfig, HeadroomConfig
from burstsched.server.serve import running_router
from burstsched.sim import SimConfig, SimPool
from tests.router.helpers import router_config

pytestmark = pytest.mark.anyio
MODEL = "kv-demo"


@pytest.fixture
async def sim_pool() -> AsyncIterator[SimPool]:
    async with SimPool(1, SimConfig(time_scale=0.3), record_requests=True) as pool:
        yield pool


def _body(seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    text = " ".join(f"w{rng.randrange(100_000)}" for _ in range(900))  # distinct: no shared prefix
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 2}


async def test_priorities_shedding_and_nothing_lost(sim_pool: SimPool) -> None:
    flow = FlowControlConfig(
        enabled=True,
        headroom=HeadroomConfig(max_prefill_ms=0.001, max_prefill_requests=1),
        objectives={"urgent": 10, "batch": -1},
    )
    config = router_config(list(zip(sim_pool.names, sim_pool.urls, strict=True)), flow_control=flow)
    statuses: dict[str, int] = {}
    views: list[dict[str, object]] = []
    async with (
        running_router(config, rng=random.Random(1)) as router,
        httpx.AsyncClient(base_url=router.url, timeout=60) as client,
    ):

        async def send(name: str, seed: int, objective: str | None = None) -> None:
            headers = {"x-request-id": name, "x-llm-d-inference-fairness-id": name[:4]}
            if objective is not None:
                headers["x-llm-d-inference-objective"] = objective
            response = await client.post("/v1/chat/completions", json=_body(seed), headers=headers)
            statuses[name] = response.status_code
            if response.status_code == 429:
                assert response.headers["retry-after"] == "1"
                assert "sheddable" in response.json()["error"]["message"]

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(6):
                    tg.start_soon(send, f"low-{i}", i)
                    await anyio.sleep(0.01)
                await anyio.sleep(0.05)
                views.append((await client.get("/admin/queue")).json())
                tg.start_soon(send, "shed-0", 99, "batch")
                for i in range(3):
                    tg.start_soon(send, f"high-{i}", 100 + i, "urgent")
        metrics = (await client.get("/metrics")).text
        since_start = (await client.get("/admin/queue")).json()["since_start"]
    held = views[0]["requests"]
    assert isinstance(held, int) and held >= 3, views  # the queue held the low ones
    assert since_start["shed"]["requests"] == 1 and since_start["shed"]["longest_wait_s"] == 0.0
    assert since_start["released"]["requests"] >= 3 + held  # the urgent ones, and those it held
    assert since_start["released"]["most_overtaken"] >= 2
    assert since_start["released"]["longest_wait_s"] > 0
    assert statuses.pop("shed-0") == 429
    assert set(statuses.values()) == {200} and len(statuses) == 9  # nothing lost
    order = [r.headers.get("x-request-id", "") for r in sim_pool.requests(0)]
    order = [rid for rid in order if rid.startswith(("low", "high"))]
    last_high = max(order.index(f"high-{i}") for i in range(3))
    lows_after = [rid for rid in order[last_high:] if rid.startswith("low")]
    assert len(lows_after) >= 2, order  # the urgent ones overtook queued low ones
    assert 'burstsched_flow_queue_wait_seconds_count{outcome="released",priority="10"} 3.0' in metrics
    assert 'outcome="shed",priority="-1"' in metrics
