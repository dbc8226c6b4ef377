"""EndpointPool.add/remove/sync: joining until checked and scraped, draining until in-flight ends."""

from __future__ import annotations

import anyio
import pytest

from burstsched.config import EndpointConfig, PoolConfig
from burstsched.pool import EndpointPool

from .helpers import eventually

pytestmark = pytest.mark.anyio

METRICS = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.1\n"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Replicas:
    """Answers /health and /metrics for the URLs it knows; ``metrics_ok`` gates the scrapes."""

    def __init__(self) -> None:
        self.metrics_ok = True

    async def __call__(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        if url.endswith("/health"):
            return 200, b""
        if url.endswith("/metrics"):
            return (200, METRICS) if self.metrics_ok else (500, b"")
        return 404, b""


def _pool(fetch: _Replicas, removed: list[str], changes: list[str]) -> EndpointPool:
    config = PoolConfig(scrape_interval_ms=5.0, health_check_interval_ms=5.0)
    return EndpointPool(
        [], config, fetch, clock=anyio.current_time, on_removed=removed.append, on_change=changes.append
    )


A = EndpointConfig(url="http://10.0.0.5:8000", name="a")
B = EndpointConfig(url="http://10.0.0.6:8000", name="b")


async def test_added_endpoint_joins_only_after_a_check_and_a_scrape() -> None:
    replicas = _Replicas()
    replicas.metrics_ok = False
    removed: list[str] = []
    changes: list[str] = []
    pool = _pool(replicas, removed, changes)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pool.run)
        pool.sync([A], source="dns")
        assert [(s.name, s.state, s.source) for s in pool.statuses()] == [("a", "joining", "dns")]
        assert not pool.snapshot("a").healthy
        await eventually(
            lambda: pool.healthy_count() == 0 and pool.statuses()[0].state == "joining", within_s=1
        )
        await anyio.sleep(0.05)  # many health checks pass, but no scrape yet: still joining
        assert pool.statuses()[0].state == "joining" and pool.healthy_count() == 0
        replicas.metrics_ok = True
        await eventually(lambda: pool.snapshot("a").healthy, within_s=5)
        assert pool.statuses()[0].state == "healthy"
        tg.cancel_scope.cancel()
    assert changes == ["added"]


async def test_removed_endpoint_drains_its_in_flight_requests_then_goes() -> None:
    removed: list[str] = []
    changes: list[str] = []
    pool = _pool(_Replicas(), removed, changes)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pool.run)
        pool.sync([A, B], source="kubernetes")
        await eventually(lambda: pool.healthy_count() == 2, within_s=5)
        pool.acquire("a")  # a stream in flight through a
        pool.sync([B], source="kubernetes")
        assert {s.name: s.state for s in pool.statuses()} == {"a": "draining", "b": "healthy"}
        assert not pool.snapshot("a").healthy  # no new request is scheduled there
        assert pool.begin_attempt("a") is None  # nor dispatched there while anything else is left
        assert pool.healthy_count() == 1
        assert removed == []
        pool.report_success("a")  # the stream finishes normally
        pool.release("a")
        assert removed == ["a"]
        assert [s.name for s in pool.statuses()] == ["b"]
        assert "a" not in pool.names
        assert pool.member("a") is None  # retired: the flow queue's fast path treats it as gone
        assert pool.snapshot("a").name == "a"  # late accounting still finds it
        member_b = pool.member("b")
        assert member_b is not None and member_b.healthy
        pool.end_attempt("a", pool.circuit_state("a"))  # late calls for the gone endpoint still land
        tg.cancel_scope.cancel()
    assert changes == ["added", "added", "removed", "drained"]


async def test_flapping_endpoint_comes_back_before_it_drained() -> None:
    removed: list[str] = []
    changes: list[str] = []
    pool = _pool(_Replicas(), removed, changes)
    async with anyio.create_task_group() as tg:
        tg.start_soon(pool.run)
        pool.sync([A], source="dns")
        await eventually(lambda: pool.healthy_count() == 1, within_s=5)
        pool.acquire("a")
        pool.sync([], source="dns")
        assert pool.statuses()[0].state == "draining"
        pool.sync([A], source="dns")
        assert pool.statuses()[0].state == "healthy" and pool.snapshot("a").healthy
        pool.release("a")
        assert removed == []
        pool.sync([], source="dns")  # nothing in flight: gone at once
        assert removed == ["a"] and pool.statuses() == []
        pool.sync([A], source="dns")  # and joins afresh
        assert pool.statuses()[0].state == "joining"
        tg.cancel_scope.cancel()
    assert changes == ["added", "removed", "restored", "removed", "drained", "added"]
