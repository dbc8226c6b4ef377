"""Failover before the first byte, the circuit breaker, error endings after it, and per-request deadlines,
through a real uvicorn router in front of simulated replicas on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from burstsched.config import CircuitConfig, DispatchConfig, LimitsConfig, RouterConfig, TimeoutsConfig
from burstsched.server.serve import RunningRouter, running_router
from burstsched.sim import Faults
from burstsched.testing.replicas import LONG_ANSWER, MODEL, Replica, sim_replicas
from burstsched.wire.sse import DONE, data_payloads

from .helpers import config_for, eventually

pytestmark = pytest.mark.anyio


def chat(i: int, **extra: object) -> dict[str, object]:
    # distinct prompts, no prefix affinity: the least-recent tie-break sends every other one to each replica
    return {"model": MODEL, "messages": [{"role": "user", "content": f"question {i} " * 50}], **extra}


@pytest.fixture
async def reps() -> AsyncIterator[list[Replica]]:
    async with sim_replicas(2) as running:
        yield running


def make_config(
    reps: list[Replica], *, first_byte_ms: float | None = 30_000, **updates: object
) -> RouterConfig:
    dispatch = DispatchConfig(
        max_attempts=2,
        timeouts=TimeoutsConfig(first_byte_ms=first_byte_ms),
        circuit=CircuitConfig(failure_threshold=3, open_ms=60_000, max_open_ms=60_000),
    )
    return config_for([(r.name, r.url) for r in reps], dispatch=dispatch, **updates)


async def read_stream(client: httpx.AsyncClient, body: dict[str, object]) -> tuple[httpx.Response, str]:
    with anyio.fail_after(20):
        async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
            text = (await response.aread()).decode()
    return response, text


async def test_a_replica_stalling_before_its_first_byte_is_left_and_its_circuit_opens(
    reps: list[Replica],
) -> None:
    stalled, good = reps
    await stalled.set_faults(Faults(stall_before_first_byte_s=1.5))
    async with (
        running_router(make_config(reps, first_byte_ms=200)) as router,
        httpx.AsyncClient(base_url=router.url, timeout=20) as client,
    ):
        attempts = []
        for i in range(12):
            response, text = await read_stream(client, chat(i))
            assert response.status_code == 200
            assert response.headers["x-burstsched-endpoint"] == good.name
            assert data_payloads(text)[-1] == DONE and "error" not in text
            attempts.append(int(response.headers["x-burstsched-attempts"]))
        # three requests tried the stalled replica first and moved on; then its circuit kept it out
        assert len(stalled.requests) == 3
        assert attempts.count(2) == 3 and attempts.count(1) == 9
        assert not router.app.state.router.pool.snapshot(stalled.name).healthy
        metrics = (await client.get("/metrics")).text
        assert (
            f'burstsched_upstream_attempts_total{{endpoint="{stalled.name}",result="timeout"}} 3.0' in metrics
        )


async def test_a_replica_dying_between_its_headers_and_its_first_chunk_is_not_a_lost_request(
    reps: list[Replica],
) -> None:
    dying, good = reps
    await dying.set_faults(Faults(disconnect_after_events=0))  # the response head, then nothing
    async with (
        running_router(make_config(reps)) as router,
        httpx.AsyncClient(base_url=router.url, timeout=20) as client,
    ):
        for i in range(4):
            # the router's scrape of the last request's replica may still show it busy: its load would break
            # the tie the alternation comes from
            await eventually(lambda: _seen_idle(router))
            response, text = await read_stream(client, chat(i))
            assert response.status_code == 200
            assert response.headers["x-burstsched-endpoint"] == good.name
            events = data_payloads(text)
            assert events[-1] == DONE and not any('"error"' in e for e in events)
    assert len(dying.requests) == 2  # every other request was sent there first, and moved


async def _seen_idle(router: RunningRouter) -> bool:
    """Whether the router's view of every replica is idle: nothing in flight, running or in the KV cache."""
    snapshots = router.app.state.router.pool.snapshots()
    return all(s.in_flight == 0 and s.running == 0 and s.waiting == 0 and s.kv_usage == 0 for s in snapshots)


async def test_5xx_everywhere_is_a_502_json_never_a_truncation(reps: list[Replica]) -> None:
    for rep in reps:
        await rep.fail_with(503)
    async with (
        running_router(make_config(reps)) as router,
        httpx.AsyncClient(base_url=router.url, timeout=20) as client,
    ):
        for stream in (False, True):
            response = await client.post("/v1/chat/completions", json=chat(0, stream=stream))
            assert response.status_code == 502
            assert response.headers["content-type"] == "application/json"
            error = response.json()["error"]
            assert error["type"] == "bad_gateway" and "HTTP 503" in error["message"]


async def test_a_stream_cut_after_its_first_byte_ends_with_an_error_event_and_done(
    reps: list[Replica],
) -> None:
    for rep in reps:
        await rep.set_faults(Faults(disconnect_after_events=2))  # the role chunk and a first token
    async with (
        running_router(make_config(reps)) as router,
        httpx.AsyncClient(base_url=router.url, timeout=20) as client,
    ):
        response, text = await read_stream(client, chat(0))
    assert response.status_code == 200
    role, token, error_event, done = data_payloads(text)
    assert json.loads(role)["choices"][0]["delta"]["role"] == "assistant"
    assert json.loads(token)["choices"][0]["delta"]["content"]
    assert json.loads(error_event)["error"]["type"] == "bad_gateway"
    assert done == DONE
    assert sum(len(r.requests) for r in reps) == 1  # never retried once bytes went out


async def test_the_request_deadline_answers_504_before_the_first_byte_and_ends_a_stream_after_it(
    reps: list[Replica],
) -> None:
    limits = LimitsConfig(request_timeout_ms=500)
    async with (
        running_router(make_config(reps, limits=limits)) as router,
        httpx.AsyncClient(base_url=router.url, timeout=20) as client,
    ):
        response, text = await read_stream(client, chat(0, max_tokens=LONG_ANSWER))  # outlasts the deadline
        assert response.status_code == 200
        events = data_payloads(text)
        assert json.loads(events[0])["choices"][0]["delta"]["role"] == "assistant"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "timeout_error" and error["message"].startswith("the request took longer")
        assert events[-1] == DONE

        for rep in reps:
            await rep.set_faults(Faults(stall_before_first_byte_s=3.0))  # nothing at all within the deadline
        response = await client.post("/v1/chat/completions", json=chat(1))
        assert response.status_code == 504
        assert response.json()["error"]["type"] == "timeout_error"

        async def released() -> bool:
            pool = router.app.state.router.pool
            return all(pool.snapshot(r.name).in_flight == 0 for r in reps)

        await eventually(released)


async def test_a_killed_endpoint_leaves_scoring_and_its_prefix_entries_expire() -> None:
    async with sim_replicas(2) as reps:
        config = make_config(reps)
        async with (
            running_router(config) as router,
            httpx.AsyncClient(base_url=router.url, timeout=20) as client,
        ):
            shared = {"model": MODEL, "messages": [{"role": "user", "content": "shared context " * 400}]}
            first = await client.post("/v1/chat/completions", json=shared)
            warm_name = first.headers["x-burstsched-endpoint"]
            again = await client.post("/v1/chat/completions", json=shared)
            assert again.headers["x-burstsched-endpoint"] == warm_name  # prefix affinity
            scheduler = router.app.state.router.scheduler
            index = next(p for p in scheduler.profile.plugins if hasattr(p, "index")).index
            assert index.size(warm_name) > 0

            warm = next(r for r in reps if r.name == warm_name)
            await warm.kill()  # gone: its health checks fail

            async def forgotten() -> bool:
                return bool(index.size(warm_name) == 0)

            await eventually(forgotten)
            served = await client.post("/v1/chat/completions", json=shared)
            assert served.status_code == 200
            assert served.headers["x-burstsched-endpoint"] != warm_name
