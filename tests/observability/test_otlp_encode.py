"""The direct OTLP encoder writes exactly the bytes OpenTelemetry's own encoder writes for the same spans:
the router's span records are converted to the SDK's ``ReadableSpan`` and encoded by ``encode_spans``
(``opentelemetry-exporter-otlp-proto-common``), and the two outputs must be equal."""

from __future__ import annotations

import logging
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from burstsched.telemetry.otlp_encode import SpanEncoder, varint
from burstsched.telemetry.span_record import SpanRecord, SpanRecorder

RESOURCE = Resource.create({"service.name": "burstsched", "deployment": "test"})
SCOPE = InstrumentationScope("burstsched", "1.2.3")
REMOTE = SpanContext(
    trace_id=0x0AF7651916CD43DD8448EB211C80319C,
    span_id=0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=TraceFlags(1),
    trace_state=TraceState([("vendor", "a1"), ("other", "b2")]),
)


def _recorder(resource: Resource = RESOURCE) -> tuple[SpanRecorder, list[SpanRecord]]:
    ended: list[SpanRecord] = []
    return SpanRecorder(ended.append, ALWAYS_ON, resource, rng=random.Random(7)), ended


def _encoder(resource: Resource = RESOURCE) -> SpanEncoder:
    return SpanEncoder(resource, SCOPE.name, SCOPE.version or "")


def as_readable(record: SpanRecord, resource: Resource = RESOURCE) -> ReadableSpan:
    """The same span as the SDK would have finished it."""
    state = TraceState.from_header([record.trace_state]) if record.trace_state else TraceState()
    flags = TraceFlags(record.trace_flags)
    context = SpanContext(record.trace_id, record.span_id, False, flags, state)
    parent = (
        SpanContext(record.trace_id, record.parent_span_id, record.parent_remote, flags, state)
        if record.parent_span_id
        else None
    )
    return ReadableSpan(
        name=record.name,
        context=context,
        parent=parent,
        resource=resource,
        attributes=record.attributes,
        events=[Event(name, attributes, timestamp) for name, timestamp, attributes in record.events],
        kind=record.kind,
        instrumentation_scope=SCOPE,
        status=Status(record.status, record.status_message or None),
        start_time=record.start_ns,
        end_time=record.end_ns,
    )


def _reference(records: list[SpanRecord], resource: Resource = RESOURCE) -> bytes:
    return encode_spans([as_readable(r, resource) for r in records]).SerializeToString()


def _records_of_every_shape() -> list[SpanRecord]:
    recorder, ended = _recorder()
    server = recorder.root(
        "POST /v1/chat/completions",
        set_span_in_context(NonRecordingSpan(REMOTE)),
        attributes={
            "http.request.method": "POST",
            "server.port": 8000,
            "big": 2**62,
            "negative": -5,
            "ratio": 0.25,
            "flag": True,
            "off": False,
            "empty": "",
            "zero": 0,
            "unicode": "τοκεν ✓",
            "strings": ["a", "b"],
            "ints": [1, -2, 300],
            "floats": [0.5, 1e300],
            "bools": [True, False],
            "long": "x" * 300,
        },
    )
    assert server is not None
    server.add_event("burstsched.schedule", {"candidates": ["r0", "r1"], "totals": [0.5, 0.25]})
    server.add_event("empty")
    client = recorder.child(server, "chat kv-demo", kind=SpanKind.CLIENT, attributes={"attempt": 0})
    client.set_status(StatusCode.ERROR, "upstream 503")
    client.end()
    admission = recorder.child(server, "burstsched.admission")
    admission.set_status(StatusCode.OK)
    admission.end()
    try:
        raise ValueError("bad body")
    except ValueError as error:
        server.record_exception(error)
    server.end()
    new = recorder.root("GET /v1/models", None, kind=SpanKind.SERVER)
    assert new is not None
    for kind in (SpanKind.PRODUCER, SpanKind.CONSUMER, SpanKind.INTERNAL):
        recorder.child(new, kind.name.lower(), kind=kind).end()
    new.end()
    return ended


def test_every_shape_is_encoded_byte_for_byte_as_opentelemetry_does() -> None:
    records = _records_of_every_shape()
    ours = _encoder().encode(records)
    assert ours == _reference(records)
    (resource_spans,) = ExportTraceServiceRequest.FromString(ours).resource_spans
    (scope_spans,) = resource_spans.scope_spans
    assert (scope_spans.scope.name, len(scope_spans.spans)) == ("burstsched", len(records))


def test_cached_pairs_give_the_same_bytes_on_the_second_batch() -> None:
    records = _records_of_every_shape()
    encoder = _encoder()
    first = encoder.encode(records)
    assert encoder.encode(records) == first


def test_a_resource_with_a_schema_url() -> None:
    resource = Resource.create({"service.name": "s"}, schema_url="https://opentelemetry.io/schemas/1.21.0")
    recorder, ended = _recorder(resource)
    root = recorder.root("s", None)
    assert root is not None
    root.end()
    assert _encoder(resource).encode(ended) == _reference(ended, resource)


def test_an_attribute_that_cannot_be_encoded_is_left_out_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    recorder, ended = _recorder()
    span = recorder.root("s", None, attributes={"ok": 1})
    assert span is not None
    span.attributes.update({"huge": 2**70, "odd": object()})  # type: ignore[dict-item]
    span.end()
    with caplog.at_level(logging.ERROR):
        ours = _encoder().encode(ended)
    (decoded,) = ExportTraceServiceRequest.FromString(ours).resource_spans[0].scope_spans[0].spans
    assert [kv.key for kv in decoded.attributes] == ["ok"]
    assert "huge" in caplog.text and "odd" in caplog.text


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**32, 2**63, 2**64 - 1])
def test_varint_reads_back(value: int) -> None:
    from google.protobuf.internal.decoder import _DecodeVarint  # type: ignore[attr-defined]

    assert _DecodeVarint(varint(value), 0) == (value, len(varint(value)))


_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_VALUES = st.one_of(
    st.text(max_size=40),
    st.booleans(),
    _INT64,
    st.floats(allow_nan=False),
    st.lists(st.text(max_size=5), max_size=4),
    st.lists(_INT64, max_size=4),
    st.lists(st.floats(allow_nan=False), max_size=3),
)


@settings(max_examples=200, deadline=None)
@given(
    attributes=st.dictionaries(st.text(min_size=1, max_size=12), _VALUES, max_size=12),
    name=st.text(max_size=30),
    event=st.text(max_size=10),
    message=st.text(max_size=20),
)
def test_any_attributes_match_opentelemetry(
    attributes: dict[str, object], name: str, event: str, message: str
) -> None:
    recorder, ended = _recorder()
    span = recorder.root(name, None, attributes=dict(attributes))  # type: ignore[arg-type]
    assert span is not None
    span.add_event(event, dict(attributes))  # type: ignore[arg-type]
    span.set_status(StatusCode.ERROR, message)
    span.end()
    assert _encoder().encode(ended) == _reference(ended)


def test_a_key_whose_values_do_not_repeat_stops_being_cached_and_stays_exact() -> None:
    recorder, ended = _recorder()
    for i in range(600):
        span = recorder.root("r", None, attributes={"request.id": f"req-{i}", "n": i, "model": "m"})
        assert span is not None
        span.end()
    encoder = _encoder()
    assert encoder.encode(ended) == _reference(ended)
    assert encoder.encode(ended) == _reference(ended)  # cached and uncached keys alike, twice
    fields = encoder._fields
    assert fields[(b"\x4a", "request.id", str)] is None and fields[(b"\x4a", "n", int)] is None
    assert fields[(b"\x4a", "model", str)] == {"m": _field_of(encoder, "model", "m")}


def _field_of(encoder: SpanEncoder, key: str, value: str) -> bytes:
    recorder, ended = _recorder()
    span = recorder.root("r", None, attributes={key: value})
    assert span is not None
    span.end()
    (decoded,) = (
        ExportTraceServiceRequest.FromString(encoder.encode(ended)).resource_spans[0].scope_spans[0].spans
    )
    (attribute,) = decoded.attributes
    return b"\x4a" + bytes([attribute.ByteSize()]) + attribute.SerializeToString()
