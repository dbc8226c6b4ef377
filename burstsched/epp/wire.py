"""Envoy's ext_proc messages as the endpoint picker protocol uses them.

What the protocol fixes (Gateway API Inference Extension, proposal 004):

- the destination goes to the gateway both as the ``x-gateway-destination-endpoint`` request header and as
  the same value under ``x-gateway-destination-endpoint`` in the ``envoy.lb`` namespace of the response's
  dynamic metadata: ``IP:PORT``, or several joined by commas (the first is the pick, the rest fallbacks in
  order);
- the gateway may restrict the candidates with a list under ``x-gateway-destination-endpoint-subset`` in the
  ``envoy.lb.subset_hint`` namespace of the request's filter metadata;
- the endpoint that served the response comes back as ``x-gateway-destination-endpoint-served`` in the
  ``envoy.lb`` namespace of the response messages' metadata;
- no ready endpoint is an immediate 503, a shed request an immediate 429.

The destination header is set with ``OVERWRITE_IF_EXISTS_OR_ADD`` (Envoy's default appends to a header the
client sent), so the upstream request carries only the picker's value.

The answers sent on every request are built lean (the per-request CPU of the picker is mostly gRPC's, and
this keeps its own share small): the answers naming a destination or an endpoint are serialised once per
value and parsed back from those bytes (a fresh message each time, byte for byte the one built field by
field), and a streamed body piece is set along its field path instead of through five nested constructors.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from urllib.parse import urlsplit

from google.protobuf.struct_pb2 import Struct, Value

from burstsched.epp.pb.ext_proc_pb2 import (
    BodyResponse,
    CommonResponse,
    HeaderMap,
    HeaderMutation,
    HeadersResponse,
    HeaderValue,
    HeaderValueOption,
    HttpStatus,
    ImmediateResponse,
    ProcessingRequest,
    ProcessingResponse,
    TrailersResponse,
)
from burstsched.wire.errors import error_body

DESTINATION = "x-gateway-destination-endpoint"
"""The header and the metadata key carrying the picked endpoint(s)."""
NAMESPACE = "envoy.lb"
"""The dynamic-metadata namespace of the destination (and of the served endpoint)."""
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"
ENDPOINT_HEADER = "x-burstsched-endpoint"
"""The response header naming the replica that served (as ``burstsched serve`` sets it)."""
BODY_CHUNK_BYTES = 62_000
"""The largest body piece in one streamed body response (llm-d's limit, under Envoy's message limits)."""

_OVERWRITE = HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD
_CACHED = 1024
"""How many serialised answers (destinations, endpoint names) and endpoint addresses are kept."""


def header_values(headers: HeaderMap) -> dict[str, str]:
    """Envoy's header map (keys lower-cased by Envoy; values in ``raw_value``, or ``value`` from older
    gateways); a repeated header keeps its last value."""
    return {h.key: (h.raw_value.decode("latin-1") if h.raw_value else h.value) for h in headers.headers}


def response_head(headers: HeaderMap) -> tuple[str, str | None]:
    """A response's ``:status`` and ``content-length`` (None when absent), read as :func:`header_values`
    reads them, without decoding the other headers."""
    status, length = "", None
    for h in headers.headers:
        key = h.key
        if key == ":status":
            status = h.raw_value.decode("latin-1") if h.raw_value else h.value
        elif key == "content-length":
            length = h.raw_value.decode("latin-1") if h.raw_value else h.value
    return status, length


@lru_cache(maxsize=_CACHED)
def endpoint_address(url: str) -> str:
    """``IP:PORT`` (``[IPv6]:PORT``) of an endpoint's base URL, as the gateway connects to it."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def subset_hint(request: ProcessingRequest) -> frozenset[str] | None:
    """The gateway's subset of candidate addresses; None when it set none (then the whole pool)."""
    if not request.HasField("metadata_context"):
        return None
    hint = request.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if hint is None or SUBSET_KEY not in hint.fields:
        return None
    value = hint.fields[SUBSET_KEY]
    if value.HasField("list_value"):
        return frozenset(v.string_value for v in value.list_value.values if v.string_value)
    return frozenset(a.strip() for a in value.string_value.split(",") if a.strip())


def served_address(request: ProcessingRequest) -> str | None:
    """The address the gateway says served the response (response messages only), if it said."""
    if not request.HasField("metadata_context"):
        return None
    lb = request.metadata_context.filter_metadata.get(NAMESPACE)
    if lb is None or SERVED_KEY not in lb.fields:
        return None
    return lb.fields[SERVED_KEY].string_value or None


def _set(key: str, value: str) -> HeaderValueOption:
    return HeaderValueOption(
        header=HeaderValue(key=key, raw_value=value.encode("latin-1")), append_action=_OVERWRITE
    )


def destination_metadata(addresses: Sequence[str]) -> Struct:
    """``{"envoy.lb": {"x-gateway-destination-endpoint": "IP:PORT[,IP:PORT...]"}}``."""
    return Struct(
        fields={
            NAMESPACE: Value(
                struct_value=Struct(fields={DESTINATION: Value(string_value=",".join(addresses))})
            )
        }
    )


def routing(addresses: Sequence[str]) -> CommonResponse:
    """The request's header mutation: the destination set, replacing any client copy."""
    mutation = HeaderMutation(set_headers=[_set(DESTINATION, ",".join(addresses))])
    return CommonResponse(header_mutation=mutation, clear_route_cache=True)


def stripping() -> CommonResponse:
    """A request-headers answer that only removes a client-sent destination header."""
    return CommonResponse(header_mutation=HeaderMutation(remove_headers=[DESTINATION]))


def request_headers(common: CommonResponse, metadata: Struct | None = None) -> ProcessingResponse:
    response = ProcessingResponse(request_headers=HeadersResponse(response=common))
    if metadata is not None:
        response.dynamic_metadata.CopyFrom(metadata)
    return response


def request_body(common: CommonResponse, metadata: Struct | None = None) -> ProcessingResponse:
    response = ProcessingResponse(request_body=BodyResponse(response=common))
    if metadata is not None:
        response.dynamic_metadata.CopyFrom(metadata)
    return response


def destination(addresses: Sequence[str], *, buffered: bool) -> ProcessingResponse:
    """The answer that routes the request to ``addresses``: the request headers' answer (full duplex) or
    the request body's (``buffered``), with :func:`routing`'s header mutation and
    :func:`destination_metadata`."""
    return ProcessingResponse.FromString(_destination(tuple(addresses), buffered))


@lru_cache(maxsize=_CACHED)
def _destination(addresses: tuple[str, ...], buffered: bool) -> bytes:
    answer = request_body if buffered else request_headers
    return answer(routing(addresses), destination_metadata(addresses)).SerializeToString()


def response_headers(endpoint_name: str | None, served: tuple[str, str] | None = None) -> ProcessingResponse:
    """The answer to the response's headers: names the replica that served, as ``serve`` does, and with
    ``served`` (a header name, an ``IP:PORT``) that address in that header."""
    return ProcessingResponse.FromString(_response_headers(endpoint_name, served))


@lru_cache(maxsize=_CACHED)
def _response_headers(endpoint_name: str | None, served: tuple[str, str] | None) -> bytes:
    common = CommonResponse()
    if endpoint_name is not None:
        common.header_mutation.set_headers.append(_set(ENDPOINT_HEADER, endpoint_name))
    if served is not None:
        common.header_mutation.set_headers.append(_set(*served))
    return ProcessingResponse(response_headers=HeadersResponse(response=common)).SerializeToString()


def body_passed(*, request: bool) -> ProcessingResponse:
    """A BUFFERED or STREAMED body message let through unchanged."""
    body = BodyResponse(response=CommonResponse())
    return ProcessingResponse(request_body=body) if request else ProcessingResponse(response_body=body)


def streamed(body: bytes, *, end_of_stream: bool, request: bool) -> list[ProcessingResponse]:
    """FULL_DUPLEX_STREAMED: ``body`` given back to the gateway, in pieces of at most
    :data:`BODY_CHUNK_BYTES`; the last carries ``end_of_stream`` (an empty body still makes one message)."""
    if len(body) <= BODY_CHUNK_BYTES:  # nearly always: one piece
        return [_piece(body, end_of_stream, request)]
    pieces = range(0, len(body), BODY_CHUNK_BYTES)
    last = pieces[-1]
    return [_piece(body[i : i + BODY_CHUNK_BYTES], end_of_stream and i == last, request) for i in pieces]


def _piece(piece: bytes, end_of_stream: bool, request: bool) -> ProcessingResponse:
    """One streamed body response; its fields set along their path (each marks the messages above it
    present, as the nested constructors do), a quarter of the constructors' cost."""
    response = ProcessingResponse()
    answer = response.request_body if request else response.response_body
    streamed_response = answer.response.body_mutation.streamed_response
    streamed_response.body = piece
    streamed_response.end_of_stream = end_of_stream
    return response


def trailers(*, request: bool) -> ProcessingResponse:
    if request:
        return ProcessingResponse(request_trailers=TrailersResponse())
    return ProcessingResponse(response_trailers=TrailersResponse())


def immediate(
    status: int,
    message: str,
    *,
    headers: Sequence[tuple[str, str]] = (),
    param: str | None = None,
    code: str | None = None,
) -> ProcessingResponse:
    """An immediate response in OpenAI's error shape (JSON, as ``serve`` answers it)."""
    body = json.dumps(error_body(status, message, param=param, code=code)).encode()
    mutation = HeaderMutation(set_headers=[_set("content-type", "application/json")])
    mutation.set_headers.extend(_set(k, v) for k, v in headers)
    return ProcessingResponse(
        immediate_response=ImmediateResponse(
            status=HttpStatus(code=status), headers=mutation, body=body, details=f"burstsched_epp_{status}"
        )
    )
