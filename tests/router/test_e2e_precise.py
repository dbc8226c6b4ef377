"""End to end in precise mode: a real router following simulated replicas' KV events over ZMQ.

The router tokenizes through a replica's ``/tokenize`` (the simulator's tokenizer, no files needed), so each
response's ``x-burstsched-predicted-cached-tokens`` can be held against the replica's own
``usage.prompt_tokens_details.cached_tokens``: equal, request by request, evictions included.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest

from burstsched.config import EndpointConfig, RouterConfig, TokenizerConfig
from burstsched.server.serve import RunningRouter, running_router
from burstsched.sim import SimConfig, SimPool

from .helpers import FAST_POOL, eventually

REPO = Path(__file__).resolve().parents[2]
MODEL = "kv-demo"
pytestmark = pytest.mark.anyio


def _precise_config(pool: SimPool, **tokenizer: object) -> RouterConfig:
    from burstsched.config import parse_config_text

    base = parse_config_text((REPO / "config" / "precise.yaml").read_text())
    endpoints = [
        EndpointConfig(name=name, url=url, kv_events=events, kv_events_replay=replay)
        for name, url, events, replay in zip(
            pool.names, pool.urls, pool.kv_events_endpoints, pool.kv_events_replay_endpoints, strict=True
        )
    ]
    return base.model_copy(
        update={
            "endpoints": endpoints,
            "pool": FAST_POOL,
            "tokenizer": TokenizerConfig.model_validate({"source": "remote", **tokenizer}),
        }
    )


def _sim_config(**overrides: object) -> SimConfig:
    base: dict[str, object] = {
        "time_scale": 0.02,
        "kv_events_endpoint": "tcp://127.0.0.1:*",
        "kv_events_replay_endpoint": "tcp://127.0.0.1:*",
    }
    return SimConfig(**{**base, **overrides})  # type: ignore[arg-type]


def _document(rng: random.Random, words: int) -> str:
    return " ".join(f"w{rng.randrange(10_000)}" for _ in range(words))


def _chat(content: str) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2}


async def _ask(client: httpx.AsyncClient, content: str) -> tuple[str, str, int, int]:
    """(endpoint, index, predicted cached tokens, actual cached tokens) of one request."""
    response = await client.post("/v1/chat/completions", json=_chat(content))
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    return (
        response.headers["x-burstsched-endpoint"],
        response.headers["x-burstsched-prefix-index"],
        int(response.headers["x-burstsched-predicted-cached-tokens"]),
        int(usage["prompt_tokens_details"]["cached_tokens"]),
    )


@pytest.fixture
async def small_pool() -> AsyncIterator[SimPool]:
    """Two replicas whose caches hold about three 300-token documents each: a working set of 10 evicts."""
    async with SimPool(2, _sim_config(num_gpu_blocks=64, max_model_len=1000)) as pool:
        yield pool


@pytest.fixture
async def precise_router(small_pool: SimPool) -> AsyncIterator[RunningRouter]:
    async with running_router(_precise_config(small_pool), rng=random.Random(3)) as running:
        yield running


async def _events_applied(pool: SimPool, router: RunningRouter) -> None:
    """Wait until the router's hub has applied every batch each replica has published so far."""
    hub = router.app.state.router.hub

    async def applied() -> bool:
        for i, name in enumerate(pool.names):
            publisher = pool.replica(i).publisher
            stream = hub.stream(name)
            assert publisher is not None and stream is not None
            if publisher.next_seq > 0 and stream.last_seq != publisher.next_seq - 1:
                return False
        return True

    await eventually(applied, within_s=10)


async def test_predictions_match_the_replicas_cache_through_evictions(
    small_pool: SimPool, precise_router: RunningRouter
) -> None:
    rng = random.Random(5)
    documents = [_document(rng, 280) for _ in range(10)]
    asked = 0
    exact = 0
    warm_hits = 0
    async with httpx.AsyncClient(base_url=precise_router.url, timeout=30) as client:
        await _ask(client, "warm up the event streams")
        for _ in range(60):
            doc = documents[min(int(rng.paretovariate(1.0)) - 1, 9)]
            endpoint, index, predicted, actual = await _ask(client, f"{doc}\nQuestion {rng.random()}?")
            assert index == "precise"
            asked += 1
            exact += predicted == actual
            warm_hits += actual > 0
            # concurrency 1: every event the replicas published is applied before the next decision
            await _events_applied(small_pool, precise_router)
        metrics = (await client.get("/metrics")).text
    assert exact == asked, f"{asked - exact} of {asked} predictions were wrong"
    assert warm_hits > 10  # the popular documents were found warm
    assert 'burstsched_kv_events_total{endpoint="sim-0",type="BlockRemoved"}' in metrics  # evictions happened
    assert 'burstsched_prefix_decisions_total{index="precise"}' in metrics
    assert 'burstsched_tokenizations_total{outcome="ok"}' in metrics


async def test_a_burst_lands_on_one_replica_before_any_event(precise_router: RunningRouter) -> None:
    rng = random.Random(9)
    prefix = _document(rng, 250)
    async with httpx.AsyncClient(base_url=precise_router.url, timeout=30) as client:
        results: list[str] = []

        async def one(i: int) -> None:
            response = await client.post("/v1/chat/completions", json=_chat(f"{prefix}\nQ{i}?"))
            assert response.status_code == 200
            results.append(response.headers["x-burstsched-endpoint"])

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(one, i)
    assert len(set(results)) == 1


async def test_without_a_tokenizer_answer_requests_fall_back_and_succeed(small_pool: SimPool) -> None:
    config = _precise_config(small_pool)
    config = config.model_copy(update={"tokenizer": TokenizerConfig(source="none")})
    async with (
        running_router(config) as running,
        httpx.AsyncClient(base_url=running.url, timeout=30) as client,
    ):
        response = await client.post("/v1/chat/completions", json=_chat("hello " * 200))
        assert response.status_code == 200
        assert response.headers["x-burstsched-prefix-index"] == "approximate"
        assert "x-burstsched-predicted-cached-tokens" not in response.headers


class _Restartable:
    """One simulated replica on fixed ports (HTTP, events, replay), so a new process can take its place."""

    def __init__(self, name: str) -> None:
        from burstsched.testing.ports import free_port

        self.name = name
        self.ports = (free_port(), free_port(), free_port())
        self.pool: SimPool | None = None

    @property
    def endpoint(self) -> EndpointConfig:
        http, events, replay = self.ports
        return EndpointConfig(
            name=self.name,
            url=f"http://127.0.0.1:{http}",
            kv_events=f"tcp://127.0.0.1:{events}",
            kv_events_replay=f"tcp://127.0.0.1:{replay}",
        )

    async def start(self) -> None:
        http, events, replay = self.ports
        config = _sim_config(
            name=self.name,
            port=http,
            # like vLLM, a publisher binds an address with a wildcard host (and connects to any other)
            kv_events_endpoint=f"tcp://*:{events}",
            kv_events_replay_endpoint=f"tcp://*:{replay}",
        )
        self.pool = SimPool(1, config)
        await self.pool.__aenter__()

    async def stop(self) -> None:
        if self.pool is not None:
            await self.pool.__aexit__(None, None, None)
            self.pool = None


async def test_a_restarted_replica_loses_its_entries_and_requests_keep_succeeding() -> None:
    """The replica holding a document is replaced by a new process on the same ports: the router drops its
    entries (health check or the event sequence going back), no request fails, no prediction is stale."""
    replicas = [_Restartable("sim-0"), _Restartable("sim-1")]
    rng = random.Random(11)
    doc = _document(rng, 280)
    try:
        for replica in replicas:
            await replica.start()
        base = _precise_config(replicas[0].pool)  # type: ignore[arg-type]
        config = base.model_copy(update={"endpoints": [r.endpoint for r in replicas]})
        async with (
            running_router(config) as running,
            httpx.AsyncClient(base_url=running.url, timeout=30) as client,
        ):
            hub = running.app.state.router.hub
            await _ask(client, "warm up")
            before = [await _ask(client, f"{doc}\nQ{i}?") for i in range(3)]
            home = before[0][0]
            assert all(b[0] == home for b in before) and before[-1][2] == before[-1][3] > 0
            stream = hub.stream(home)
            assert stream.last_seq is not None  # the events flowed: the predictions came from them
            restarted = next(r for r in replicas if r.name == home)
            await restarted.stop()
            await restarted.start()
            after = [await _ask(client, f"{doc}\nQ again {i}?") for i in range(6)]
            metrics = (await client.get("/metrics")).text
    finally:
        for replica in replicas:
            await replica.stop()
    # every request succeeded (asserted in _ask); the first one after the restart expected no cached blocks
    assert after[0][2] == after[0][3] == 0, after
    assert all(predicted == actual for _, _, predicted, actual in after), after
    assert f'burstsched_kv_events_total{{endpoint="{home}",type="BlockStored"}}' in metrics
    assert 'burstsched_prefix_decisions_total{index="approximate"}' not in metrics
