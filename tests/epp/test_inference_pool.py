"""``burstsched epp`` finding its endpoints from an InferencePool (``inference.networking.k8s.io/v1``) through
the Kubernetes client, against a fake API server: the pool's selector chooses the Ready pods, each target
port its own endpoint; requests through a real Envoy reach them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import httpx
import pytest

from burstsched.config import RouterConfig
from burstsched.discovery import InferencePoolDiscovery, InferencePoolError, api_factory
from burstsched.discovery.inference_pool import pool_endpoints, pool_spec
from burstsched.epp.service import running_epp
from burstsched.server.serve import serving
from burstsched.sim import SimPool
from burstsched.testing.fake_kube import FakeKubeApi, inference_pool, pod
from burstsched.workloads.gateway import EnvoyMode, envoy
from tests.router.helpers import FAST_POOL, eventually

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
LABELS = {"app": "vllm"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeKubeApi, str]]:
    fake = FakeKubeApi()
    async with serving(fake.app) as url:
        yield fake, url
        await fake.drop_watches()


def test_the_pool_spec_and_one_endpoint_per_target_port() -> None:
    spec = pool_spec(inference_pool("p", LABELS, [8000, 8001], picker="p-epp", failure_mode="FailOpen"))
    assert (spec.match_labels, spec.ports, spec.picker_service, spec.failure_mode) == (
        LABELS,
        (8000, 8001),
        "p-epp",
        "FailOpen",
    )
    endpoints = pool_endpoints(pod("vllm-0", "10.0.0.5", LABELS), "http", spec.ports)
    assert [(e.endpoint_name, e.url) for e in endpoints] == [
        ("vllm-0:8000", "http://10.0.0.5:8000"),
        ("vllm-0:8001", "http://10.0.0.5:8001"),
    ]
    assert pool_endpoints(pod("vllm-1", "10.0.0.6", LABELS, ready=False), "http", spec.ports) == []
    one = pool_endpoints(pod("vllm-0", "10.0.0.5", LABELS), "http", (8000,))
    assert [e.endpoint_name for e in one] == ["vllm-0"]
    for broken in (
        {"spec": {"targetPorts": [{"number": 1}]}},
        {"spec": {"selector": {"matchLabels": LABELS}}},
    ):
        with pytest.raises(InferencePoolError):
            pool_spec(broken)


async def test_a_missing_pool_is_named(api: tuple[FakeKubeApi, str]) -> None:
    _, url = api
    discovery = InferencePoolDiscovery(api_factory(url), name="absent", namespace="default")
    with anyio.fail_after(10), pytest.raises(InferencePoolError, match="default/absent: 404"):
        await discovery.read_pool()


async def test_requests_through_envoy_reach_every_port_of_the_pools_ready_pods(
    api: tuple[FakeKubeApi, str], sims: SimPool, envoy_path: Path, workdir: Path
) -> None:
    """One Ready pod at 127.0.0.1 listing two target ports (two simulated replicas), a pod that is not
    Ready and a pod of another app (the decoy's port): the picker's pool is the two ports; when the pod
    stops being Ready they leave it."""
    fake, url = api
    ports = [urlsplit(u).port or 0 for u in sims.urls]
    await fake.put(inference_pool("vllm-pool", LABELS, ports[:2]))
    await fake.put(pod("vllm-0", "127.0.0.1", LABELS))
    await fake.put(pod("vllm-1", "127.0.0.2", LABELS, ready=False))
    await fake.put(pod("other", "127.0.0.1", {"app": "other"}))
    discovery = InferencePoolDiscovery(
        api_factory(url), name="vllm-pool", namespace="default", min_backoff_s=0.01
    )
    config = RouterConfig().model_copy(update={"pool": FAST_POOL})
    async with running_epp(config, discovery=discovery) as epp:
        pool = epp.router.pool
        names = {f"vllm-0:{ports[0]}", f"vllm-0:{ports[1]}"}

        async def both_healthy() -> bool:
            return {s.name for s in pool.snapshots() if s.healthy} == names

        with anyio.fail_after(30):
            await eventually(both_healthy, within_s=15)
            with envoy(envoy_path, epp.port, EnvoyMode(), workdir) as gw:
                async with httpx.AsyncClient(base_url=gw.url, timeout=20) as client:
                    served = set()
                    for i in range(6):
                        body = {"model": "kv-demo", "prompt": f"distinct {i} " * 40, "max_tokens": 1}
                        response = await client.post("/v1/completions", json=body)
                        assert response.status_code == 200, response.text
                        served.add(response.headers["x-burstsched-endpoint"])
            assert served == names
            assert sims.requests(2) == []
            await fake.put(pod("vllm-0", "127.0.0.1", LABELS, ready=False))

            async def gone() -> bool:
                return not any(s.healthy for s in pool.snapshots())

            await eventually(gone, within_s=15)
    assert discovery.picker is not None and discovery.picker.failure_mode == "FailClose"
