"""End to end through a real uvicorn router in front of simulated replicas on 127.0.0.1."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest

from burstsched.config import FlowControlConfig, LimitsConfig, MetricsConfig
from burstsched.server.serve import RunningRouter, running_router
from burstsched.sim import Faults
from burstsched.testing.replicas import LONG_ANSWER, MODEL, Replica, gated_replica, sim_replicas
from burstsched.wire.sse import DONE, data_payloads

from .helpers import eventually, router_config

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 200}]}


@pytest.fixture
async def replicas() -> AsyncIterator[list[Replica]]:
    async with sim_replicas(2) as reps:
        yield reps


@pytest.fixture
async def router(replicas: list[Replica]) -> AsyncIterator[RunningRouter]:
    config = router_config(
        [(r.name, r.url) for r in replicas],
        limits=LimitsConfig(max_body_bytes=1024 * 1024),
        metrics=MetricsConfig(timing_every=1),  # every scheduling cycle timed: the metric counts are exact
        # with no healthy endpoint a request waits this long for one (a pool scaling from zero), then 503
        flow_control=FlowControlConfig(no_endpoint_wait_ms=300),
    )
    async with running_router(config) as running:
        yield running


@pytest.fixture
async def client(router: RunningRouter) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=router.url, timeout=10) as c:
        yield c


def _by_name(replicas: list[Replica], name: str) -> Replica:
    return next(r for r in replicas if r.name == name)


@pytest.mark.anyio
async def test_streaming_is_forwarded_chunk_by_chunk() -> None:
    body = {**CHAT, "stream": True}
    async with gated_replica() as gated, running_router(router_config([(gated.name, gated.url)])) as router:
        async with httpx.AsyncClient(base_url=router.url, timeout=10) as client:
            with anyio.fail_after(10):
                async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    assert response.status_code == 200
                    assert response.headers["content-type"].startswith("text/event-stream")
                    assert response.headers["x-burstsched-endpoint"] == gated.name
                    chunks = response.aiter_raw()
                    first = await anext(chunks)
                    # the replica holds its second chunk until we saw the first: a buffering proxy would hang
                    assert b"tok0" in first and b"tok1" not in first
                    gated.gate.set()
                    rest = b"".join([c async for c in chunks])
    assert b"tok1" in rest and b"tok2" in rest and rest.endswith(b"data: [DONE]\n\n")


@pytest.mark.anyio
async def test_endpoint_header_and_forwarded_headers(
    replicas: list[Replica], client: httpx.AsyncClient
) -> None:
    response = await client.post(
        "/v1/chat/completions",
        json=CHAT,
        headers={"x-request-id": "req-42", "x-secret": "no", "connection": "close"},
    )
    assert response.status_code == 200
    name = response.headers["x-burstsched-endpoint"]
    # the named replica answered: it alone received the request
    assert [len(r.requests) for r in replicas if r.name != name] == [0]
    (seen,) = _by_name(replicas, name).headers_seen
    assert seen["x-request-id"] == "req-42"
    assert "x-secret" not in seen
    assert seen["content-type"] == "application/json"
    assert int(response.headers["content-length"]) == len(response.content)


@pytest.mark.anyio
async def test_completions_and_models(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3})
    assert response.status_code == 200 and response.json()["object"] == "text_completion"
    models = (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    no_model = await client.post("/v1/completions", json={"prompt": "hi"})
    assert no_model.status_code == 200  # the only model served is implied


@pytest.mark.anyio
async def test_5xx_before_first_byte_moves_to_the_next_endpoint(
    replicas: list[Replica], client: httpx.AsyncClient
) -> None:
    broken, healthy = replicas
    await broken.fail_with(503)
    # Distinct prompts: no prefix affinity, so the tie-break rotation tries the broken replica first
    # sooner or later (which request is first there depends on the picker's seed: send up to 12).
    for i in range(12):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"{i} " * 400}],
            "stream": i % 2 == 1,
        }
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200
        assert response.headers["x-burstsched-endpoint"] == healthy.name
        if i >= 3 and broken.requests:
            break
    assert len(broken.requests) >= 1  # some requests were tried there first and moved
    metrics = (await client.get("/metrics")).text
    assert f'burstsched_upstream_attempts_total{{endpoint="{broken.name}",result="status_5xx"}}' in metrics


@pytest.mark.anyio
async def test_upstream_4xx_passes_through_without_failover(
    replicas: list[Replica], client: httpx.AsyncClient
) -> None:
    for replica in replicas:
        await replica.fail_with(400)
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "injected fault: HTTP 400"  # the replica's own body
    assert sum(len(r.requests) for r in replicas) == 1


@pytest.mark.anyio
async def test_every_attempt_failing_gives_502_json(
    replicas: list[Replica], client: httpx.AsyncClient
) -> None:
    for replica in replicas:
        await replica.fail_with(500)
    for stream in (False, True):
        response = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["type"] == "bad_gateway" and "HTTP 500" in error["message"]
    assert all(len(r.requests) == 2 for r in replicas)  # max_attempts 2: each request tried both


@pytest.mark.anyio
async def test_failure_after_first_byte_ends_with_an_error_event(
    replicas: list[Replica], client: httpx.AsyncClient
) -> None:
    for replica in replicas:
        await replica.set_faults(Faults(disconnect_after_events=2))  # the role chunk and a first token
    with anyio.fail_after(10):
        async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
            assert response.status_code == 200
            events = data_payloads(await response.aread())
    role, token, error_event, done = events
    assert json.loads(role)["choices"][0]["delta"]["role"] == "assistant"
    assert json.loads(token)["choices"][0]["delta"]["content"]
    error = json.loads(error_event)["error"]
    assert error["type"] == "bad_gateway" and "mid-stream" in error["message"]
    assert done == DONE
    assert sum(len(r.requests) for r in replicas) == 1  # no retry once bytes went out


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("path", "content", "headers", "status", "param"),
    [
        ("/v1/chat/completions", b"{broken", {}, 400, None),
        (
            "/v1/chat/completions",
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "\xff"}]}',
            {},
            400,
            None,
        ),
        ("/v1/chat/completions", b'{"model": "fake-model"}', {}, 400, "messages"),
        ("/v1/completions", b'{"model": "fake-model"}', {}, 400, "prompt"),
        ("/v1/chat/completions", b'{"model": 1, "messages": []}', {}, 400, "model"),
        ("/v1/completions", b'{"model": "fake-model", "prompt": "x", "stream": 1}', {}, 400, "stream"),
        (
            "/v1/chat/completions",
            b'{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}',
            {},
            404,
            "model",
        ),
        ("/v1/completions", b"x" * (1024 * 1024 + 1), {}, 413, None),
        ("/v1/nothing", b"{}", {}, 404, None),
    ],
)
async def test_bad_input_gets_openai_errors_never_500(
    client: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
    path: str,
    content: bytes,
    headers: dict[str, str],
    status: int,
    param: str | None,
) -> None:
    caplog.set_level(logging.ERROR)
    response = await client.post(path, content=content, headers=headers)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param
    assert error["type"] in ("invalid_request_error", "not_found_error")
    assert not [r for r in caplog.records if "unexpected error" in r.getMessage()]


@pytest.mark.anyio
async def test_declared_oversize_body_is_refused_before_reading(router: RunningRouter) -> None:
    port = int(router.url.rsplit(":", 1)[1])
    head = (
        "POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        "content-length: 99999999999\r\n\r\n{}"
    )
    with anyio.fail_after(10):
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(head.encode())
            reply = b""
            while b"request_too_large" not in reply:
                try:
                    reply += await stream.receive()
                except anyio.EndOfStream:
                    break
    status_line, _, rest = reply.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 413")
    assert b"request_too_large" in rest


@pytest.mark.anyio
async def test_wrong_method_is_405_json(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/chat/completions")
    assert response.status_code == 405
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.anyio
async def test_no_healthy_endpoint_is_503(replicas: list[Replica], client: httpx.AsyncClient) -> None:
    assert (await client.get("/ready")).status_code == 200
    for replica in replicas:
        await replica.kill()

    async def not_ready() -> bool:
        return (await client.get("/ready")).status_code == 503

    await eventually(not_ready)
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "service_unavailable"
    assert (await client.get("/health")).status_code == 200
    assert all(not r.requests for r in replicas)


@pytest.mark.anyio
async def test_client_disconnect_cancels_the_upstream_request(
    replicas: list[Replica], router: RunningRouter, client: httpx.AsyncClient
) -> None:
    body = {**CHAT, "stream": True, "max_tokens": LONG_ANSWER}  # still generating when the client leaves
    with anyio.fail_after(10):
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            serving = _by_name(replicas, response.headers["x-burstsched-endpoint"])
            assert b"chat.completion.chunk" in await anext(response.aiter_raw())
    pool = router.app.state.router.pool

    async def cancelled_everywhere() -> bool:
        counted = 'outcome="cancelled"' in (await client.get("/metrics")).text
        # the replica's engine dropped the request unfinished: nothing running, nothing completed
        engine = await serving.metrics()
        aborted = engine["vllm:num_requests_running"] == 0 and engine["vllm:request_success_total"] == 0
        return aborted and pool.snapshot(serving.name).in_flight == 0 and counted

    await eventually(cancelled_everywhere)


@pytest.mark.anyio
async def test_router_metrics_count_requests_by_endpoint_and_outcome(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=CHAT)
    name = response.headers["x-burstsched-endpoint"]
    await client.post("/v1/chat/completions", content=b"{")
    text = (await client.get("/metrics")).text
    assert f'burstsched_requests_total{{endpoint="{name}",outcome="ok"}} 1.0' in text
    assert 'burstsched_requests_total{endpoint="none",outcome="rejected"} 1.0' in text
    assert "burstsched_scheduling_duration_seconds_count 1.0" in text
    assert f'burstsched_endpoint_healthy{{endpoint="{name}"}} 1.0' in text
    assert "vllm:" not in text


@pytest.mark.anyio
async def test_the_prefill_demand_gauge_reads_the_pool(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/chat/completions", json=CHAT)
    name = response.headers["x-burstsched-endpoint"]
    text = (await client.get("/metrics")).text
    prefix = f'burstsched_endpoint_prefill_demand_tokens_per_second{{endpoint="{name}"}} '
    (line,) = [line for line in text.splitlines() if line.startswith(prefix)]
    assert float(line.removeprefix(prefix)) > 0.0  # a cold request's prompt, sent to be computed
