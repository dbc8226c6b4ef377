"""End to end: a router with Kubernetes discovery (fake API) in front of simulated replicas; a replica joins
and one leaves while streaming requests run, and none is lost."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from burstsched.config import PoolConfig, RouterConfig
from burstsched.discovery import KubernetesDiscovery, api_factory
from burstsched.front.app import create_app
from burstsched.server.serve import serving
from burstsched.sim import SimConfig, SimPool
from burstsched.testing.fake_kube import FakeKubeApi, endpoint_slice

from .helpers import eventually

pytestmark = pytest.mark.anyio
MODEL = "kv-demo"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _slice(pool: SimPool, index: int) -> dict[str, object]:
    port = httpx.URL(pool.urls[index]).port
    assert port is not None
    return endpoint_slice(f"vllm-{index}", "vllm", {pool.names[index]: "127.0.0.1"}, port)


@pytest.fixture
async def sims() -> AsyncIterator[SimPool]:
    async with SimPool(3, SimConfig(time_scale=0.02), record_requests=True) as pool:
        yield pool


async def _admin_endpoints(client: httpx.AsyncClient, url: str) -> dict[str, str]:
    body = (await client.get(f"{url}/admin/endpoints")).json()
    return {e["name"]: e["state"] for e in body["endpoints"]}


async def test_replica_joins_and_one_leaves_under_streaming_load_with_nothing_lost(sims: SimPool) -> None:
    fake = FakeKubeApi()
    await fake.put(_slice(sims, 0))
    await fake.put(_slice(sims, 1))
    config = RouterConfig(
        pool=PoolConfig(scrape_interval_ms=20, staleness_threshold_ms=2000, health_check_interval_ms=50)
    )
    outcomes: list[str] = []
    stop = anyio.Event()

    async def stream_requests(client: httpx.AsyncClient, url: str, worker: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"worker {worker} request {i}: tell me more"}],
                "max_tokens": 16,
                "stream": True,
            }
            async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
                text = (await response.aread()).decode()
            outcomes.append("ok" if response.status_code == 200 and "data: [DONE]" in text else text[:200])

    async with serving(fake.app) as api_url:
        discovery = KubernetesDiscovery(api_factory(api_url), namespace="default", service="vllm")
        app = create_app(config, rng=random.Random(3), discovery=discovery)
        async with serving(app) as url, httpx.AsyncClient(timeout=30) as client:
            await eventually(lambda: app.state.router.pool.healthy_count() == 2, within_s=10)
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    for worker in range(4):
                        tg.start_soon(stream_requests, client, url, worker)
                    await eventually(lambda: len(outcomes) >= 10, within_s=20)
                    # a replica joins: it takes traffic once checked and scraped
                    await fake.put(_slice(sims, 2))
                    await eventually(lambda: len(sims.requests(2)) > 0, within_s=10)
                    # one leaves: it drains, then goes
                    await fake.delete("vllm-0")
                    await eventually(lambda: "sim-0" not in app.state.router.pool.names, within_s=10)
                    served_by_0 = len(sims.requests(0))
                    settled = len(outcomes)
                    await eventually(lambda: len(outcomes) >= settled + 10, within_s=20)
                    assert len(sims.requests(0)) == served_by_0  # nothing new went to the one that left
                    states = await _admin_endpoints(client, url)
                    stop.set()
            metrics = (await client.get(f"{url}/metrics")).text
        await fake.drop_watches()
    assert states == {"sim-1": "healthy", "sim-2": "healthy"}
    assert outcomes and all(o == "ok" for o in outcomes), [o for o in outcomes if o != "ok"][:3]
    assert 'burstsched_discovery_changes_total{change="added"} 3.0' in metrics
    assert 'burstsched_discovery_changes_total{change="drained"} 1.0' in metrics
    assert 'burstsched_discovery_endpoints{state="healthy"} 2.0' in metrics
