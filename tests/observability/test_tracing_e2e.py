"""End to end: a real uvicorn router (tracing on) in front of replicas, exporting to an in-process receiver.

The router's lifespan shuts its tracer provider down (flushing every span) when the router stops, so the
assertions run on complete traces without waiting on the batch delay.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from burstsched.config import EndpointConfig, MetricsConfig, PoolConfig, RouterConfig, TracingConfig
from burstsched.server.serve import running_router
from burstsched.sim import SimConfig, SimPool
from burstsched.telemetry import attributes as attr
from burstsched.telemetry.receiver import ReceivedSpan
from burstsched.testing.replicas import Replica, sim_replicas
from burstsched.wire.sse import data_payloads, json_object

from .receiver_fixture import served_receiver

MODEL = "kv-demo"
REPLICAS = SimConfig(time_scale=0.02)  # serving MODEL
FAST_POOL = PoolConfig(scrape_interval_ms=20, staleness_threshold_ms=2000, health_check_interval_ms=100)


def _config(endpoints: Sequence[tuple[str, str]], tracing: TracingConfig) -> RouterConfig:
    return RouterConfig(
        endpoints=[EndpointConfig(name=name, url=url) for name, url in endpoints],
        pool=FAST_POOL,
        tracing=tracing,
        metrics=MetricsConfig(timing_every=1),  # every scheduling cycle timed: the counts below are exact
    )


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def _chat(content: str) -> dict[str, object]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _by_name(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def _usage(stream: str) -> dict[str, Any]:
    """The usage chunk's counts of a stream (``stream_options.include_usage``)."""
    (usage,) = [p["usage"] for p in map(json_object, data_payloads(stream)) if p and p.get("usage")]
    assert isinstance(usage, dict)
    return usage


@pytest.mark.anyio
async def test_a_streamed_request_is_one_trace_continuing_the_clients_traceparent() -> None:
    trace_id, client_span, traceparent = _traceparent()
    async with served_receiver() as rx, SimPool(2, SimConfig(time_scale=0.02)) as pool:
        config = _config(
            list(zip(pool.names, pool.urls, strict=True)),
            TracingConfig(enabled=True, endpoint=rx.url, detail="full"),
        )
        async with running_router(config, rng=random.Random(7)) as router:
            assert router.app.state.router.tracing is not None
            async with httpx.AsyncClient(base_url=router.url, timeout=30) as client:
                response = await client.post(
                    "/v1/chat/completions", json=_chat("hello " * 200), headers={"traceparent": traceparent}
                )
                assert response.status_code == 200
                served_by = response.headers["x-burstsched-endpoint"]
                usage = _usage(response.text)
                metrics = (await client.get("/metrics")).text

    # the same request in the router's metrics
    assert f'burstsched_time_to_first_token_seconds_count{{endpoint="{served_by}"}} 1.0' in metrics
    assert f'burstsched_e2e_request_latency_seconds_count{{endpoint="{served_by}"}} 1.0' in metrics
    assert 'burstsched_admission_wait_seconds_count{role="leader"} 1.0' in metrics
    assert "burstsched_admission_group_size_count 1.0" in metrics
    assert "burstsched_prefix_estimated_hit_ratio_count 1.0" in metrics
    # a cold request alone in its group runs its producers once (the bypass check's run is reused), timed
    assert 'extension_point="producer",plugin="approx-prefix-producer"} 1.0' in metrics
    index_line = f'burstsched_prefix_index_blocks{{endpoint="{served_by}",plugin="approx-prefix-producer"}}'
    assert float(metrics.split(index_line)[1].split()[0]) > 0
    # the exporter's own counts: the request's spans wait for their batch (5 s), none dropped
    assert 'burstsched_trace_spans_total{outcome="dropped"} 0.0' in metrics
    assert 'burstsched_trace_spans_total{outcome="exported"} 0.0' in metrics
    assert float(metrics.split("\nburstsched_trace_spans_queued ")[1].split()[0]) >= 2  # admission, schedule

    spans = rx.receiver.by_trace(trace_id)
    (server,) = _by_name(spans, "POST /v1/chat/completions")
    (admission,) = _by_name(spans, attr.SPAN_ADMISSION)
    (schedule,) = _by_name(spans, attr.SPAN_SCHEDULE)
    (upstream,) = _by_name(spans, f"chat {MODEL}")
    assert server.kind == "SERVER" and server.parent_span_id == client_span
    assert {admission.parent_span_id, schedule.parent_span_id, upstream.parent_span_id} == {server.span_id}
    assert server.start_ns <= admission.start_ns <= schedule.start_ns <= schedule.end_ns <= admission.end_ns
    assert schedule.end_ns <= upstream.start_ns <= upstream.end_ns  # placement ran within admission
    assert upstream.end_ns <= server.end_ns

    assert server.attributes[attr.GEN_AI_REQUEST_MODEL] == MODEL
    assert server.attributes[attr.GEN_AI_REQUEST_MAX_TOKENS] == 4
    assert server.attributes[attr.HTTP_RESPONSE_STATUS_CODE] == 200
    assert server.attributes[attr.ENDPOINT] == served_by

    # a cold prompt long enough to share a prefix waits in a window, alone: the leader of a group of one
    assert admission.attributes[attr.GROUP_ROLE] == "leader" and admission.attributes[attr.GROUP_SIZE] == 1
    assert admission.attributes[attr.ADMISSION_BYPASS] is False and attr.WINDOW_ID in admission.attributes
    assert schedule.attributes[attr.ENDPOINT] == served_by
    assert schedule.attributes[attr.SCHEDULE_PLACED_BY] == "window"
    ranked = [e.attributes for e in schedule.events if e.name == attr.EVENT_SCORE]
    assert [e[attr.ENDPOINT] for e in ranked][0] == served_by and len(ranked) == 2
    assert all(attr.SCORE_PREFIX + "prefix-cache-scorer" in e for e in ranked)

    assert upstream.kind == "CLIENT" and upstream.attributes[attr.ENDPOINT] == served_by
    assert upstream.attributes[attr.URL_FULL].endswith("/v1/chat/completions")
    first_token = upstream.event(attr.EVENT_FIRST_TOKEN)
    assert first_token is not None and upstream.start_ns < first_token.time_ns <= upstream.end_ns
    assert upstream.attributes[attr.GEN_AI_USAGE_INPUT_TOKENS] == usage["prompt_tokens"]
    assert upstream.attributes[attr.GEN_AI_USAGE_OUTPUT_TOKENS] == usage["completion_tokens"]
    assert upstream.attributes[attr.GEN_AI_RESPONSE_ID].startswith("chatcmpl-")


@pytest.mark.anyio
async def test_the_upstream_request_carries_the_client_span_as_traceparent() -> None:
    trace_id, _, traceparent = _traceparent()
    async with served_receiver() as rx, sim_replicas(1, REPLICAS) as (replica,):
        config = _config([(replica.name, replica.url)], TracingConfig(enabled=True, endpoint=rx.url))
        async with (
            running_router(config) as router,
            httpx.AsyncClient(base_url=router.url, timeout=30) as client,
        ):
            response = await client.post(
                "/v1/chat/completions",
                json=_chat("hi"),
                headers={"traceparent": traceparent, "tracestate": "vendor=1"},
            )
            assert response.status_code == 200
        (seen,) = replica.headers_seen

    (upstream,) = _by_name(rx.receiver.by_trace(trace_id), f"chat {MODEL}")
    assert seen["traceparent"] == f"00-{trace_id}-{upstream.span_id}-01"
    assert seen["tracestate"] == "vendor=1"
    assert upstream.attributes[attr.GEN_AI_RESPONSE_FINISH_REASONS] == ["length"]
    assert upstream.attributes[attr.GEN_AI_USAGE_INPUT_TOKENS] == _usage(response.text)["prompt_tokens"]


async def _failed_over(client: httpx.AsyncClient) -> str:
    """Send distinct requests until one is tried on the failing replica first and moves on; its trace id.

    Which replica a request without prefix affinity tries first depends on the picker's tie-break (a
    random draw): each request has its own chance, so a few suffice."""
    for i in range(24):
        trace_id, _, traceparent = _traceparent()
        response = await client.post(
            "/v1/chat/completions", json=_chat(f"question {i} " * 50), headers={"traceparent": traceparent}
        )
        assert response.status_code == 200
        if response.headers["x-burstsched-attempts"] == "2":
            return trace_id
    raise AssertionError("no request was tried on the failing replica first")


def _traceparents(replica: Replica, trace_id: str) -> list[str]:
    return [
        h["traceparent"]
        for h in replica.headers_seen
        if h.get("traceparent", "").startswith(f"00-{trace_id}-")
    ]


@pytest.mark.anyio
async def test_failover_records_one_client_span_per_attempt() -> None:
    async with served_receiver() as rx, sim_replicas(2, REPLICAS) as (a, b):
        await a.fail_with(503)
        config = _config([(a.name, a.url), (b.name, b.url)], TracingConfig(enabled=True, endpoint=rx.url))
        async with (
            running_router(config) as router,
            httpx.AsyncClient(base_url=router.url, timeout=30) as client,
        ):
            trace_id = await _failed_over(client)
        seen = _traceparents(a, trace_id) + _traceparents(b, trace_id)

    (server,) = _by_name(rx.receiver.by_trace(trace_id), "POST /v1/chat/completions")
    attempts = sorted(
        (s for s in rx.receiver.by_trace(trace_id) if s.kind == "CLIENT"),
        key=lambda s: s.attributes[attr.UPSTREAM_ATTEMPT],
    )
    assert [s.attributes[attr.UPSTREAM_ATTEMPT] for s in attempts] == [0, 1]
    assert [s.attributes[attr.ENDPOINT] for s in attempts] == [a.name, b.name]
    failed, served = attempts
    assert failed.status == "ERROR" and failed.attributes[attr.HTTP_RESPONSE_STATUS_CODE] == 503
    assert (
        failed.attributes[attr.UPSTREAM_RESULT] == "status_5xx"
        and failed.event(attr.EVENT_FIRST_TOKEN) is None
    )
    assert served.status == "UNSET" and served.attributes[attr.HTTP_REQUEST_RESEND_COUNT] == 1
    assert served.event(attr.EVENT_FIRST_TOKEN) is not None
    assert failed.end_ns <= served.start_ns
    assert server.attributes[attr.ENDPOINT] == served.attributes[attr.ENDPOINT]
    assert sorted(seen) == sorted(f"00-{trace_id}-{s.span_id}-01" for s in attempts)


@pytest.mark.anyio
async def test_tracing_off_builds_no_tracer() -> None:
    async with sim_replicas(1, REPLICAS) as (replica,):
        config = _config([(replica.name, replica.url)], TracingConfig())
        async with (
            running_router(config) as router,
            httpx.AsyncClient(base_url=router.url, timeout=30) as client,
        ):
            assert router.app.state.router.tracing is None
            response = await client.post(
                "/v1/chat/completions", json=_chat("x"), headers={"traceparent": "00-bad"}
            )
            assert response.status_code == 200
        assert replica.headers_seen[0]["traceparent"] == "00-bad"  # passed through untouched


@pytest.mark.anyio
async def test_sampling_follows_the_clients_flag_and_skips_unsampled_requests() -> None:
    sampled_trace, _, sampled = _traceparent()
    unsampled_trace, unsampled_span, _ = _traceparent()
    unsampled = f"00-{unsampled_trace}-{unsampled_span}-00"
    async with served_receiver() as rx, sim_replicas(1, REPLICAS) as (replica,):
        tracing = TracingConfig(enabled=True, endpoint=rx.url, sample_ratio=0.0)
        config = _config([(replica.name, replica.url)], tracing)
        async with (
            running_router(config) as router,
            httpx.AsyncClient(base_url=router.url, timeout=30) as client,
        ):
            for headers in ({"traceparent": sampled}, {"traceparent": unsampled}, {}):
                response = await client.post("/v1/chat/completions", json=_chat("x"), headers=headers)
                assert response.status_code == 200
        sent = [h.get("traceparent") for h in replica.headers_seen]

    assert {s.trace_id for s in rx.receiver.spans} == {sampled_trace}  # the client asked for this one only
    assert len(rx.receiver.spans) == 2  # server and client: lean detail, a warm or lone request
    assert sent[0] is not None and sent[0].startswith(f"00-{sampled_trace}-") and sent[0] != sampled
    assert sent[1:] == [unsampled, None]  # unsampled requests pass the client's header on untouched
