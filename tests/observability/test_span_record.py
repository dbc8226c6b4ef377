"""Span records: sampling at the root as the SDK's samplers decide, ids and trace context carried to
children and to the ``traceparent`` header, one hand-over per span, exceptions as the SDK records them."""

from __future__ import annotations

import random

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, StatusCode, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from burstsched.telemetry.span_record import SpanRecord, SpanRecorder

RESOURCE = Resource.create({"service.name": "t"})
PROPAGATOR = TraceContextTextMapPropagator()
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def _recorder(ratio: float | None = None, seed: int = 1) -> tuple[SpanRecorder, list[SpanRecord]]:
    ended: list[SpanRecord] = []
    sampler = ALWAYS_ON if ratio is None else ParentBased(TraceIdRatioBased(ratio))
    clock = iter(range(1000, 10**9, 1000))
    return SpanRecorder(
        ended.append, sampler, RESOURCE, rng=random.Random(seed), clock_ns=lambda: next(clock)
    ), ended


def _remote(flags: str, state: str | None = None) -> dict[str, str]:
    carrier = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-{flags}"}
    if state is not None:
        carrier["tracestate"] = state
    return carrier


def test_a_new_trace_follows_the_ratio_and_a_clients_trace_its_flag() -> None:
    never, _ = _recorder(0.0)
    always, _ = _recorder(1.0)
    assert never.root("r", None) is None
    assert always.root("r", None) is not None
    sampled_parent = PROPAGATOR.extract(_remote("01"))
    unsampled_parent = PROPAGATOR.extract(_remote("00"))
    assert never.root("r", sampled_parent) is not None  # the client's decision wins (parent-based)
    assert always.root("r", unsampled_parent) is None
    # a third of new traces at 1/3: the ratio sampler's own rule on the trace id
    third, _ = _recorder(1 / 3, seed=5)
    kept = sum(third.root("r", None) is not None for _ in range(3000))
    assert 850 < kept < 1150


def test_a_continued_trace_keeps_the_clients_ids_and_state_down_to_the_upstream_header() -> None:
    recorder, ended = _recorder()
    root = recorder.root("POST /v1/chat/completions", PROPAGATOR.extract(_remote("01", "vendor=a1,other=b2")))
    assert root is not None
    assert (f"{root.trace_id:032x}", f"{root.parent_span_id:016x}", root.parent_remote) == (
        CLIENT_TRACE,
        CLIENT_SPAN,
        True,
    )
    child = recorder.child(root, "chat m", kind=SpanKind.CLIENT)
    assert (child.trace_id, child.parent_span_id, child.parent_remote) == (root.trace_id, root.span_id, False)
    assert child.span_id not in (0, root.span_id)
    # what the SDK's propagator reads back from the header we write is this very span
    carrier = {"traceparent": child.traceparent(), "tracestate": child.trace_state}
    read = PROPAGATOR.extract(carrier)
    context = get_current_span(read).get_span_context()
    assert (context.trace_id, context.span_id, context.trace_flags, dict(context.trace_state)) == (
        root.trace_id,
        child.span_id,
        1,
        {"vendor": "a1", "other": "b2"},
    )
    child.end()
    child.end()
    root.end(end_time=99)
    assert ended == [child, root] and root.end_ns == 99  # each handed over once, when it ends


def test_a_new_trace_gets_fresh_nonzero_ids_from_the_rng() -> None:
    first, _ = _recorder(seed=3)
    again, _ = _recorder(seed=3)
    a, b = first.root("r", None), again.root("r", None)
    assert a is not None and b is not None
    assert (a.trace_id, a.span_id) == (b.trace_id, b.span_id)  # injected RNG: reproducible
    assert a.trace_id.bit_length() > 64 and a.parent_span_id == 0 and not a.parent_remote


def test_status_and_exception_as_the_sdk_records_them() -> None:
    recorder, _ = _recorder()
    span = recorder.root("r", None)
    assert span is not None
    span.set_status(StatusCode.OK, "ignored")
    assert (span.status, span.status_message) == (StatusCode.OK, "")
    span.set_status(StatusCode.ERROR, "boom")
    assert (span.status, span.status_message) == (StatusCode.ERROR, "boom")

    sdk_span = TracerProvider(shutdown_on_exit=False).get_tracer("t").start_span("r")
    try:
        raise KeyError("missing")
    except KeyError as error:
        span.record_exception(error)
        sdk_span.record_exception(error)
    ((name, _, attributes),) = span.events
    (sdk_event,) = sdk_span.events  # type: ignore[attr-defined]
    assert (name, attributes) == (sdk_event.name, dict(sdk_event.attributes))
