"""A minimal OTLP/HTTP trace receiver, for tests and local checks: ``POST /v1/traces`` (protobuf) → spans.

In a test, serve :attr:`TraceReceiver.app` on 127.0.0.1 (e.g. with ``burstsched.server.serve.serving``) and
point the exporter at ``<url>/v1/traces``; :attr:`TraceReceiver.spans` holds what arrived, decoded.
As a process,
``python -m burstsched.telemetry.receiver --port 4318`` accepts traces and, when stopped (SIGINT/SIGTERM),
prints how many spans it received.
"""

from __future__ import annotations

import argparse
import gzip
import signal
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import anyio
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

PROTOBUF = "application/x-protobuf"
_KINDS = {
    Span.SPAN_KIND_UNSPECIFIED: "UNSPECIFIED",
    Span.SPAN_KIND_INTERNAL: "INTERNAL",
    Span.SPAN_KIND_SERVER: "SERVER",
    Span.SPAN_KIND_CLIENT: "CLIENT",
    Span.SPAN_KIND_PRODUCER: "PRODUCER",
    Span.SPAN_KIND_CONSUMER: "CONSUMER",
}
_STATUS = {Status.STATUS_CODE_UNSET: "UNSET", Status.STATUS_CODE_OK: "OK", Status.STATUS_CODE_ERROR: "ERROR"}


@dataclass(frozen=True)
class ReceivedEvent:
    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived; ids in lowercase hex (``parent_span_id`` empty for a root span)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[ReceivedEvent, ...]
    status: str
    status_message: str
    service_name: str
    resource: dict[str, Any] = field(default_factory=dict)

    def event(self, name: str) -> ReceivedEvent | None:
        """The first event called ``name``, if any."""
        return next((e for e in self.events if e.name == name), None)


def decode_value(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as a Python value (arrays as lists, key-value lists as dicts)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [decode_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return decode_attributes(value.kvlist_value.values)
    return getattr(value, kind)


def decode_attributes(pairs: Sequence[KeyValue]) -> dict[str, Any]:
    return {pair.key: decode_value(pair.value) for pair in pairs}


def decode_request(body: bytes) -> list[ReceivedSpan]:
    """The spans of one protobuf ``ExportTraceServiceRequest`` (:class:`DecodeError` if it is not one)."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = decode_attributes(resource_spans.resource.attributes)
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        name=span.name,
                        kind=_KINDS.get(span.kind, str(span.kind)),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=decode_attributes(span.attributes),
                        events=tuple(
                            ReceivedEvent(e.name, e.time_unix_nano, decode_attributes(e.attributes))
                            for e in span.events
                        ),
                        status=_STATUS.get(span.status.code, str(span.status.code)),
                        status_message=span.status.message,
                        service_name=service,
                        resource=resource,
                    )
                )
    return spans


class TraceReceiver:
    """Collects the spans POSTed to ``/v1/traces``; serve :attr:`app` on a local port."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._arrived = anyio.Event()
        self.app = Starlette(routes=[Route("/v1/traces", self._export, methods=["POST"])])

    async def _export(self, request: Request) -> Response:
        body = await request.body()
        encoding = request.headers.get("content-encoding", "").lower()
        try:
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            if not request.headers.get("content-type", "").startswith(PROTOBUF):
                return Response("only application/x-protobuf is accepted", status_code=415)
            spans = decode_request(body)
        except (DecodeError, OSError, zlib.error) as exc:
            return Response(f"undecodable export request: {exc}", status_code=400)
        self.requests += 1
        self.spans.extend(spans)
        arrived, self._arrived = self._arrived, anyio.Event()
        arrived.set()
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type=PROTOBUF)

    def by_trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]

    async def wait_for(self, check: Callable[[list[ReceivedSpan]], bool], *, timeout_s: float = 30.0) -> None:
        """Return once ``check(spans)`` holds; TimeoutError after ``timeout_s``."""
        with anyio.fail_after(timeout_s):
            while not check(self.spans):
                await self._arrived.wait()


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description="OTLP/HTTP trace receiver that counts what it gets")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4318)
    args = parser.parse_args(argv)
    receiver = TraceReceiver()
    server = uvicorn.Server(
        uvicorn.Config(receiver.app, host=args.host, port=args.port, log_level="warning", access_log=False)
    )
    # uvicorn raises the signal that stopped it again once it is done; SIGTERM's default action would end
    # the process before the count below is printed
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        print(f"received {len(receiver.spans)} spans in {receiver.requests} export requests", flush=True)
    return 0


def _interrupted(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    raise SystemExit(main())
