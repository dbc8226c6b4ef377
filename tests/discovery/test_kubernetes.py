"""Kubernetes discovery through the real client (kubernetes_asyncio) over HTTP against a fake API server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest

from burstsched.config import EndpointConfig
from burstsched.discovery import KubernetesDiscovery, api_factory
from burstsched.discovery.kubernetes import pod_endpoints, slice_endpoints
from burstsched.server.serve import serving
from burstsched.testing.fake_kube import FakeKubeApi, endpoint_slice

from .helpers import eventually

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeKubeApi, str]]:
    fake = FakeKubeApi()
    async with serving(fake.app) as url:
        yield fake, url
        await fake.drop_watches()  # let open watch streams end before the server stops


def _names(endpoints: list[EndpointConfig]) -> list[tuple[str, str]]:
    return [(e.endpoint_name, e.url) for e in endpoints]


async def test_list_then_watch_adds_modifies_deletes_and_survives_bookmarks_drops_and_410(
    api: tuple[FakeKubeApi, str],
) -> None:
    fake, url = api
    await fake.put(endpoint_slice("vllm-a", "vllm", {"pod-0": "10.0.0.5"}, 8000))
    await fake.put(endpoint_slice("other", "other-svc", {"pod-x": "10.0.9.9"}, 8000))
    discovery = KubernetesDiscovery(
        api_factory(url), namespace="default", service="vllm", min_backoff_s=0.01, max_backoff_s=0.05
    )
    sets = discovery.endpoint_sets()
    with anyio.fail_after(10):
        assert _names(await anext(sets)) == [("pod-0", "http://10.0.0.5:8000")]
        # a new replica in a second slice
        await fake.put(endpoint_slice("vllm-b", "vllm", {"pod-1": "10.0.0.6"}, 8001))
        assert _names(await anext(sets)) == [
            ("pod-0", "http://10.0.0.5:8000"),
            ("pod-1", "http://10.0.0.6:8001"),
        ]
        # a bookmark moves the version on and changes nothing; the next watch starts from it
        await fake.bookmark()
        bookmark_version = fake.version
        # not ready any more: gone from the set
        await fake.put(endpoint_slice("vllm-a", "vllm", {"pod-0": "10.0.0.5"}, 8000, ready=False))
        assert _names(await anext(sets)) == [("pod-1", "http://10.0.0.6:8001")]
        # a dropped watch reconnects from the last version seen
        await fake.drop_watches()
        await fake.put(endpoint_slice("vllm-a", "vllm", {"pod-0": "10.0.0.5"}, 8000))
        assert _names(await anext(sets)) == [
            ("pod-0", "http://10.0.0.5:8000"),
            ("pod-1", "http://10.0.0.6:8001"),
        ]
        assert len(fake.watches) >= 2
        assert all(w.get("allowWatchBookmarks") in ("true", "True") for w in fake.watches)
        assert int(fake.watches[-1]["resourceVersion"]) > bookmark_version
        assert fake.lists == 1
        # history compacted while the watch is cut: 410 Gone, then a relist that misses no deletion
        fake.compact()
        await fake.drop_watches()
        await fake.delete("vllm-b")
        assert _names(await anext(sets)) == [("pod-0", "http://10.0.0.5:8000")]
        assert fake.gone_sent == 1
        assert fake.lists == 2
        assert discovery.relists == 2
    await sets.aclose()


async def test_unreachable_api_is_retried_with_backoff_until_it_answers() -> None:
    fake = FakeKubeApi()
    await fake.put(endpoint_slice("vllm-a", "vllm", {"pod-0": "10.0.0.5"}, 8000))
    async with serving(fake.app) as url:
        pass  # the port is free again: the first attempts are refused
    discovery = KubernetesDiscovery(
        api_factory(url), namespace="default", service="vllm", min_backoff_s=0.01, max_backoff_s=0.02
    )
    sets = discovery.endpoint_sets()
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            first: list[list[EndpointConfig]] = []

            async def read() -> None:
                first.append(await anext(sets))

            tg.start_soon(read)
            await eventually(lambda: discovery.reconnects >= 2, within_s=5)
            tg.cancel_scope.cancel()
    assert not first
    assert discovery.relists == 0
    await sets.aclose()


def test_slice_endpoints_keep_ready_ones_and_name_them_by_pod() -> None:
    obj = endpoint_slice("s", "vllm", {"pod-0": "10.0.0.5", "pod-1": "10.0.0.6"}, 9000)
    obj["endpoints"][1]["conditions"] = {"ready": True, "terminating": True}
    obj["endpoints"].append({"addresses": ["10.0.0.7"]})  # no conditions: ready; no targetRef: named by IP
    assert _names(slice_endpoints(obj, "http", 8000)) == [
        ("pod-0", "http://10.0.0.5:9000"),
        ("host-10-0-0-7", "http://10.0.0.7:9000"),
    ]


def test_pod_endpoints_need_ready_ip_and_no_deletion() -> None:
    ready = {"type": "Ready", "status": "True"}
    pod = {"metadata": {"name": "p"}, "status": {"podIP": "fd00::5", "conditions": [ready]}}
    assert _names(pod_endpoints(pod, "http", 8000)) == [("p", "http://[fd00::5]:8000")]
    assert pod_endpoints({**pod, "metadata": {"name": "p", "deletionTimestamp": "now"}}, "http", 8000) == []
    assert pod_endpoints({"metadata": {"name": "p"}, "status": {"podIP": "10.0.0.1"}}, "http", 8000) == []
