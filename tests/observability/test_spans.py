"""The span helpers alone: a real tracer provider exporting over OTLP/HTTP to an in-process receiver."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from starlette.types import Message, Scope

from burstsched.admission import Role
from burstsched.framework import Decision, EndpointSnapshot, PrefixMatch, ScoredEndpoint
from burstsched.telemetry import Tracing, TracingSettings
from burstsched.telemetry import attributes as attr
from burstsched.telemetry.receiver import ReceivedSpan, TraceReceiver

from .receiver_fixture import ServedReceiver, served_receiver

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
async def receiver() -> AsyncIterator[ServedReceiver]:
    async with served_receiver() as served:
        yield served


def _scope(*headers: tuple[bytes, bytes]) -> Scope:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "scheme": "http",
        "http_version": "1.1",
        "headers": [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"test/1"), *headers],
        "client": ("127.0.0.1", 50000),
    }


def _decision() -> Decision:
    a = EndpointSnapshot(name="sim-0", url="http://127.0.0.1:9001")
    b = EndpointSnapshot(name="sim-1", url="http://127.0.0.1:9002")
    return Decision(
        (
            ScoredEndpoint(a, {"prefix-cache-scorer": 1.0, "queue-scorer": 0.5}, 4.0),
            ScoredEndpoint(b, {"prefix-cache-scorer": 0.0, "queue-scorer": 1.0}, 2.0),
        ),
        {"sim-0": PrefixMatch(12, 12, 16, "precise"), "sim-1": PrefixMatch(0, 12, 16, "precise")},
    )


class _Admitted:
    """An admission outcome, shaped as ``burstsched.admission.Admitted``."""

    def __init__(self, decision: Decision, role: Role = Role.MEMBER) -> None:
        self.decision = decision
        bypass = role is Role.BYPASS
        self.window_id = 7
        self.group_id = None if bypass else "7.0"
        self.role = role
        self.group_size = 1 if bypass else 3
        self.shared_blocks = 0 if bypass else 12
        self.waited_s = 0.0 if bypass else 0.009
        self.scheduled_s = 0.002


async def _sink(message: Message) -> None:
    return None


async def _export(tracing: Tracing) -> None:
    await tracing.aclose()  # exports what is queued


def _one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    matching = [s for s in spans if s.name == name]
    assert len(matching) == 1, [s.name for s in spans]
    return matching[0]


@pytest.mark.anyio
async def test_a_request_trace_continues_the_client_trace_and_nests_its_children(
    receiver: ServedReceiver,
) -> None:
    tracing = Tracing(TracingSettings(receiver.traces_url, "burstsched-test", 1.0, full_detail=True))
    trace = tracing.begin(_scope((b"traceparent", f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01".encode())))
    assert trace is not None
    trace.describe(
        {"max_tokens": 8, "temperature": 0, "stream": True}, chat=True, model="kv-demo", request_id="req-1"
    )
    trace.admission_started()
    trace.admitted(_Admitted(_decision()))
    upstream = trace.upstream("sim-0", "http://127.0.0.1:9001/v1/chat/completions", 0)
    headers = upstream.inject(
        [(b"content-type", b"application/json"), (b"traceparent", b"00-client-was-here")]
    )
    upstream.response(200)
    upstream.chunk(b'data: {"id": "chatcmpl-9", "model": "kv-demo", "choices": [{"delta": {}}]}\n\n')
    usage = {"prompt_tokens": 300, "completion_tokens": 8, "prompt_tokens_details": {"cached_tokens": 256}}
    upstream.chunk(
        b"data: " + json.dumps({"id": "chatcmpl-9", "choices": [], "usage": usage}).encode() + b"\n\n"
    )
    upstream.chunk(b"data: [DONE]\n\n")
    upstream.end()
    await trace.wrap_send(_sink)({"type": "http.response.start", "status": 200, "headers": []})
    trace.end()
    await _export(tracing)

    spans = receiver.receiver.spans
    assert {s.trace_id for s in spans} == {CLIENT_TRACE}
    server = _one(spans, "POST /v1/chat/completions")
    admission = _one(spans, attr.SPAN_ADMISSION)
    schedule = _one(spans, attr.SPAN_SCHEDULE)
    client = _one(spans, "chat kv-demo")
    assert (server.kind, server.parent_span_id, server.service_name) == (
        "SERVER",
        CLIENT_SPAN,
        "burstsched-test",
    )
    assert {admission.parent_span_id, schedule.parent_span_id, client.parent_span_id} == {server.span_id}
    assert client.kind == "CLIENT"

    assert server.attributes[attr.GEN_AI_OPERATION_NAME] == "chat"
    assert server.attributes[attr.GEN_AI_REQUEST_MODEL] == "kv-demo"
    assert server.attributes[attr.GEN_AI_REQUEST_MAX_TOKENS] == 8
    assert server.attributes[attr.HTTP_RESPONSE_STATUS_CODE] == 200
    assert server.attributes[attr.SERVER_PORT] == 8000
    assert server.attributes[attr.ENDPOINT] == "sim-0"

    assert admission.attributes[attr.WINDOW_ID] == 7
    assert admission.attributes[attr.GROUP_ID] == "7.0"
    assert admission.attributes[attr.GROUP_ROLE] == "member"
    assert admission.attributes[attr.ADMISSION_BYPASS] is False
    assert schedule.attributes[attr.ENDPOINT] == "sim-0"
    assert schedule.attributes[attr.GROUP_SIZE] == 3
    assert schedule.attributes[attr.SCHEDULE_PLACED_BY] == "window"
    assert schedule.attributes[attr.PREFIX_INDEX] == "precise"
    assert (
        schedule.attributes[attr.PREFIX_MATCHED_BLOCKS],
        schedule.attributes[attr.PREFIX_TOTAL_BLOCKS],
    ) == (12, 12)
    assert schedule.start_ns <= admission.end_ns and schedule.end_ns <= client.start_ns
    assert schedule.end_ns - schedule.start_ns == 2_000_000  # the scheduler's own time, from admission
    scores = {
        e.attributes[attr.ENDPOINT]: e.attributes for e in schedule.events if e.name == attr.EVENT_SCORE
    }
    assert scores["sim-0"][attr.SCORE_PREFIX + "prefix-cache-scorer"] == 1.0
    assert scores["sim-1"][attr.SCORE_PREFIX + "queue-scorer"] == 1.0
    assert (scores["sim-0"][attr.SCORE_RANK], scores["sim-1"][attr.SCORE_TOTAL]) == (0, 2.0)

    assert client.attributes[attr.ENDPOINT] == "sim-0"
    assert (client.attributes[attr.SERVER_ADDRESS], client.attributes[attr.SERVER_PORT]) == (
        "127.0.0.1",
        9001,
    )
    assert client.attributes[attr.GEN_AI_RESPONSE_ID] == "chatcmpl-9"
    assert client.attributes[attr.GEN_AI_USAGE_INPUT_TOKENS] == 300
    assert client.attributes[attr.GEN_AI_USAGE_OUTPUT_TOKENS] == 8
    assert client.attributes[attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 256
    first_token = client.event(attr.EVENT_FIRST_TOKEN)
    assert first_token is not None and client.start_ns <= first_token.time_ns <= client.end_ns

    traceparents = [v for k, v in headers if k == b"traceparent"]
    assert traceparents == [f"00-{CLIENT_TRACE}-{client.span_id}-01".encode()]


@pytest.mark.anyio
async def test_failed_attempts_and_handler_errors_are_error_spans(receiver: ServedReceiver) -> None:
    tracing = Tracing(TracingSettings(receiver.traces_url, "burstsched", 1.0, full_detail=True))
    trace = tracing.begin(_scope())
    assert trace is not None
    trace.describe({"prompt": "x"}, chat=False, model="kv-demo", request_id="req-2")
    trace.admission_started()
    trace.admitted(_Admitted(_decision(), Role.BYPASS))
    first = trace.upstream("sim-0", "http://127.0.0.1:9001/v1/completions", 0)
    first.failed("connect_error", "ConnectError: refused")
    first.end()
    second = trace.upstream("sim-1", "http://127.0.0.1:9002/v1/completions", 1)
    second.response(200)
    second.body(b'{"id": "cmpl-1", "choices": [{"finish_reason": "length"}], "usage": {"prompt_tokens": 3}}')
    second.end()
    trace.admission_started()  # left open by an error: ended with the request
    trace.fail(RuntimeError("boom"))
    trace.end()
    await _export(tracing)

    spans = receiver.receiver.spans
    assert len({s.trace_id for s in spans}) == 1
    server = _one(spans, "POST /v1/chat/completions")
    assert server.parent_span_id == "" and server.status == "ERROR"
    attempts = sorted(
        (s for s in spans if s.kind == "CLIENT"), key=lambda s: s.attributes[attr.UPSTREAM_ATTEMPT]
    )
    assert [s.name for s in attempts] == ["text_completion kv-demo"] * 2
    assert (attempts[0].status, attempts[0].attributes[attr.ERROR_TYPE]) == ("ERROR", "connect_error")
    assert attempts[0].event(attr.EVENT_FIRST_TOKEN) is None
    assert attempts[1].status == "UNSET" and attempts[1].attributes[attr.HTTP_REQUEST_RESEND_COUNT] == 1
    assert attempts[1].attributes[attr.GEN_AI_RESPONSE_FINISH_REASONS] == ["length"]
    assert attempts[1].event(attr.EVENT_FIRST_TOKEN) is not None
    assert _one(spans, attr.SPAN_SCHEDULE).attributes[attr.SCHEDULE_PLACED_BY] == "request"
    admissions = [s for s in spans if s.name == attr.SPAN_ADMISSION]
    assert sorted(s.status for s in admissions) == ["ERROR", "UNSET"]


@pytest.mark.anyio
async def test_lean_detail_keeps_a_warm_request_to_two_spans_with_the_decision_on_the_server_span(
    receiver: ServedReceiver,
) -> None:
    tracing = Tracing(TracingSettings(receiver.traces_url, "burstsched", 1.0))
    for role in (Role.BYPASS, Role.MEMBER):
        trace = tracing.begin(_scope())
        assert trace is not None
        trace.describe({"max_tokens": 4}, chat=True, model="kv-demo", request_id=f"req-{role}")
        trace.admission_started()
        trace.admitted(_Admitted(_decision(), role))
        upstream = trace.upstream("sim-0", "http://127.0.0.1:9001/v1/chat/completions", 0)
        upstream.response(200)
        upstream.body(b'{"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3}}')
        upstream.end()
        trace.served("sim-0", "ok")
        trace.end()
    await _export(tracing)

    spans = receiver.receiver.spans
    by_trace: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    layouts = sorted(sorted(s.name for s in group) for group in by_trace.values())
    assert layouts == [
        ["POST /v1/chat/completions", attr.SPAN_ADMISSION, "chat kv-demo"],  # waited in a window
        ["POST /v1/chat/completions", "chat kv-demo"],  # warm: admission and scheduling on the SERVER span
    ]
    for group in by_trace.values():
        server = _one(group, "POST /v1/chat/completions")
        assert server.attributes[attr.ENDPOINT] == "sim-0"
        assert server.attributes[attr.PREFIX_INDEX] == "precise"
        assert server.attributes[attr.SCHEDULE_CANDIDATES] == 2
        event = server.event(attr.EVENT_SCHEDULE)
        assert event is not None
        assert event.attributes[attr.SCHEDULE_RANKED] == ["sim-0", "sim-1"]
        assert event.attributes[attr.SCORE_TOTAL] == [4.0, 2.0]
        assert event.attributes[attr.SCORE_PREFIX + "queue-scorer"] == [0.5, 1.0]
        assert server.start_ns <= event.time_ns <= server.end_ns
        role = server.attributes[attr.GROUP_ROLE]
        assert server.attributes[attr.SCHEDULE_PLACED_BY] == ("request" if role == "bypass" else "window")
        waits = [s for s in group if s.name == attr.SPAN_ADMISSION]
        if role == "member":
            assert waits[0].attributes[attr.GROUP_ID] == "7.0"
            assert waits[0].parent_span_id == server.span_id
        else:
            assert waits == []


@pytest.mark.anyio
async def test_the_receiver_refuses_what_is_not_an_otlp_protobuf_export(receiver: ServedReceiver) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=10) as client:
        wrong_type = await client.post(
            receiver.traces_url, content=b"{}", headers={"content-type": "application/json"}
        )
        garbage = await client.post(
            receiver.traces_url, content=b"\xff\xff", headers={"content-type": "application/x-protobuf"}
        )
    assert (wrong_type.status_code, garbage.status_code) == (415, 400)
    assert receiver.receiver.spans == [] and isinstance(receiver.receiver, TraceReceiver)
