"""Real vLLM (CPU build): vLLM's own ``llm_request`` span joins burstsched's trace through ``traceparent``.

The replica exports to the same in-process receiver as the router (vLLM over OTLP/HTTP here, chosen by
``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``; its default is gRPC). Skipped with a reason where the vLLM environment
is absent (``make real-vllm`` prepares it).
"""

from __future__ import annotations

import secrets

import httpx
import pytest

from burstsched.config import EndpointConfig, PoolConfig, RouterConfig, TracingConfig
from burstsched.server.serve import running_router
from burstsched.telemetry import attributes as attr
from burstsched.telemetry.receiver import ReceivedSpan
from burstsched.testing import VllmConfig, ensure_model
from burstsched.testing.fixtures import REAL_VLLM_TIMEOUT_S, skip_reason
from burstsched.testing.real_vllm import real_vllm_pool

from .receiver_fixture import served_receiver

pytestmark = [pytest.mark.real_vllm, pytest.mark.timeout(REAL_VLLM_TIMEOUT_S)]


def _llm_requests(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.trace_id == trace_id and s.name == "llm_request"]


@pytest.mark.anyio
async def test_vllm_spans_arrive_under_the_routers_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    # read by the vLLM process (it inherits this environment) and by the router's batch processor alike
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    async with served_receiver() as rx:
        vllm = VllmConfig(model=ensure_model(), max_model_len=2048, otlp_traces_endpoint=rx.traces_url)
        async with real_vllm_pool(1, vllm) as pool:
            config = RouterConfig(
                endpoints=[EndpointConfig(name=name, url=url) for name, url in pool.endpoints],
                pool=PoolConfig(health_check_interval_ms=200),
                tracing=TracingConfig(enabled=True, endpoint=rx.url),
            )
            async with (
                running_router(config) as router,
                httpx.AsyncClient(base_url=router.url, timeout=60) as c,
            ):
                body = {
                    "model": pool.model,
                    "messages": [{"role": "user", "content": "Tell me about prefix caching. " * 20}],
                    "max_tokens": 8,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                response = await c.post(
                    "/v1/chat/completions",
                    json=body,
                    headers={"traceparent": f"00-{trace_id}-{client_span}-01"},
                )
                assert response.status_code == 200 and "[DONE]" in response.text
            await rx.receiver.wait_for(lambda spans: bool(_llm_requests(spans, trace_id)), timeout_s=60)

    spans = rx.receiver.by_trace(trace_id)
    (server,) = [s for s in spans if s.name == "POST /v1/chat/completions"]
    (upstream,) = [s for s in spans if s.kind == "CLIENT"]
    (engine,) = _llm_requests(spans, trace_id)
    assert server.parent_span_id == client_span and upstream.parent_span_id == server.span_id
    assert engine.parent_span_id == upstream.span_id  # vLLM continued the traceparent burstsched sent
    assert engine.service_name != server.service_name == "burstsched"
    assert upstream.start_ns <= engine.start_ns and engine.end_ns <= upstream.end_ns
    # both sides count the same prompt
    assert (
        engine.attributes["gen_ai.usage.prompt_tokens"] == upstream.attributes[attr.GEN_AI_USAGE_INPUT_TOKENS]
    )
    assert (
        engine.attributes["gen_ai.usage.completion_tokens"]
        == upstream.attributes[attr.GEN_AI_USAGE_OUTPUT_TOKENS]
    )
    assert upstream.event(attr.EVENT_FIRST_TOKEN) is not None
