"""Which headers cross the proxy, each way."""

from __future__ import annotations

from collections.abc import Iterable

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)

FORWARDED_REQUEST_HEADERS = frozenset(
    {b"content-type", b"accept", b"authorization", b"x-request-id", b"traceparent", b"tracestate", b"baggage"}
)
"""Client headers sent upstream; everything else (hop-by-hop, host, cookies, lengths) stays behind."""

_DROPPED_RESPONSE_HEADERS = HOP_BY_HOP | {b"content-length", b"date", b"server"}

ENDPOINT_HEADER = b"x-burstsched-endpoint"
REQUEST_ID_HEADER = b"x-request-id"


def upstream_request_headers(
    client_headers: Iterable[tuple[bytes, bytes]], request_id: str
) -> list[tuple[bytes, bytes]]:
    """The client's forwardable headers, ``x-request-id`` set, and no compression asked of the replica."""
    out = [(k, v) for k, v in client_headers if k in FORWARDED_REQUEST_HEADERS and k != REQUEST_ID_HEADER]
    if not any(k == b"content-type" for k, _ in out):
        out.append((b"content-type", b"application/json"))  # the body was validated as JSON
    out.append((REQUEST_ID_HEADER, request_id.encode("latin-1")))
    out.append((b"accept-encoding", b"identity"))
    return out


def client_response_headers(
    upstream_headers: Iterable[tuple[bytes, bytes]], endpoint: str, *, content_length: int | None
) -> list[tuple[bytes, bytes]]:
    """The replica's end-to-end headers, our own length (when known) and the serving endpoint's name."""
    out = [(k.lower(), v) for k, v in upstream_headers if k.lower() not in _DROPPED_RESPONSE_HEADERS]
    if content_length is not None:
        out.append((b"content-length", str(content_length).encode()))
    out.append((ENDPOINT_HEADER, endpoint.encode()))
    return out
