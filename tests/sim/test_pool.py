"""SimPool: start, stop, kill, naming, async use, and bounded failures."""

from __future__ import annotations

import socket

import anyio
import httpx
import pytest

from burstsched.sim import Faults, SimConfig, SimPool, SimStartError
from burstsched.wire.sse import DONE, SSEReader

from .http_helpers import chat_body, client

FAST = SimConfig(time_scale=0.01)


def test_sync_pool_serves_on_distinct_free_ports_and_stops() -> None:
    with SimPool(3, FAST) as pool:
        assert pool.names == ["sim-0", "sim-1", "sim-2"]
        assert len(set(pool.urls)) == 3
        assert all(u.startswith("http://127.0.0.1:") for u in pool.urls)
        assert pool.kv_events_endpoints == [None, None, None]
        with httpx.Client() as http:
            assert all(http.get(f"{u}/health").status_code == 200 for u in pool.urls)
        urls = pool.urls
    with httpx.Client() as http:
        for url in urls:
            with pytest.raises(httpx.ConnectError):
                http.get(f"{url}/health")
    pool.stop()  # idempotent
    with pytest.raises(RuntimeError):
        pool.set_faults(0, Faults())


def test_configs_give_names_and_settings() -> None:
    a = SimConfig(name="alpha", time_scale=0.01, block_size=32)
    b = SimConfig(name="beta", time_scale=0.01, served_model_name="other")
    with SimPool(configs=[a, b]) as pool, httpx.Client() as http:
        assert pool.names == ["alpha", "beta"]
        assert http.get(f"{pool.urls[1]}/v1/models").json()["data"][0]["id"] == "other"
        assert 'block_size="32"' in http.get(f"{pool.urls[0]}/metrics").text


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError):
        SimPool(0)
    with pytest.raises(ValueError):
        SimPool(2, configs=[FAST])
    with pytest.raises(ValueError):
        SimPool(configs=[SimConfig(name="x"), SimConfig(name="x")])
    with pytest.raises(ValueError):
        SimConfig(block_size=0)
    with pytest.raises(ValueError):
        SimConfig(num_gpu_blocks=10, block_size=16, max_model_len=1000)


def test_a_port_in_use_is_a_clear_start_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        pool = SimPool(1, SimConfig(port=port))
        with pytest.raises(SimStartError, match="cannot bind"):
            pool.start()
        pool.stop()


@pytest.mark.anyio
async def test_async_pool_kill_drops_streams_and_refuses_connections() -> None:
    async with SimPool(2, SimConfig(time_scale=0.05)) as pool, client() as http:
        body = chat_body("a long answer please", max_tokens=5000, stream=True)
        reader = SSEReader()
        events: list[str] = []
        with pytest.raises(httpx.TransportError):
            async with http.stream("POST", f"{pool.urls[1]}/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                async for chunk in response.aiter_bytes():
                    before, events = len(events), events + reader.feed(chunk)
                    if before < 3 <= len(events):
                        await pool.akill(1)
        assert events and DONE not in events
        with pytest.raises(httpx.ConnectError):
            await http.get(f"{pool.urls[1]}/health")
        survivor = await http.post(f"{pool.urls[0]}/v1/chat/completions", json=chat_body("hi", max_tokens=2))
        assert survivor.status_code == 200
        assert await pool.areset_prefix_cache() == [True, False]


@pytest.mark.anyio
async def test_async_start_does_not_block_the_callers_loop() -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0.001)

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        async with SimPool(2, FAST) as pool:
            assert len(pool.urls) == 2
        tg.cancel_scope.cancel()
    assert ticks > 1
