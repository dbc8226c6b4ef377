"""Which headers cross the proxy, each way."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from burstsched.framework import PrefixMatch

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
ATTEMPTS_HEADER = b"x-burstsched-attempts"
PREFIX_INDEX_HEADER = b"x-burstsched-prefix-index"
PREFIX_BLOCKS_HEADER = b"x-burstsched-prefix-blocks"
PREDICTED_CACHED_HEADER = b"x-burstsched-predicted-cached-tokens"
PREDICTED_TTFT_HEADER = b"x-burstsched-predicted-ttft-ms"
"""How many endpoints were tried for the response (more than 1: it failed over)."""
REQUEST_ID_HEADER = b"x-request-id"
_UNSAFE_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
"""Control characters (CR and LF among them) that must never reach an upstream request's head."""


def upstream_request_headers(
    client_headers: Iterable[tuple[bytes, bytes]], request_id: str
) -> list[tuple[bytes, bytes]]:
    """The client's forwardable headers, ``x-request-id`` set, and no compression asked of the replica.

    A header value with control characters is dropped (an unsafe request id is replaced by ``request_id``'s
    safe rendering), so nothing a client sends can add lines to the upstream request's head.
    """
    out = [
        (k, v)
        for k, v in client_headers
        if k in FORWARDED_REQUEST_HEADERS and k != REQUEST_ID_HEADER and not _UNSAFE_VALUE.search(v)
    ]
    if not any(k == b"content-type" for k, _ in out):
        out.append((b"content-type", b"application/json"))  # the body was validated as JSON
    rid = request_id.encode("latin-1", errors="replace")
    out.append((REQUEST_ID_HEADER, _UNSAFE_VALUE.sub(b"?", rid)))
    out.append((b"accept-encoding", b"identity"))
    return out


def client_response_headers(
    upstream_headers: Iterable[tuple[bytes, bytes]],
    endpoint: str,
    *,
    content_length: int | None,
    attempts: int | None = None,
    prefix: Sequence[tuple[bytes, bytes]] = (),
) -> list[tuple[bytes, bytes]]:
    """The replica's end-to-end headers, our own length (when known), the serving endpoint's name,
    how many endpoints were tried (``attempts``, when given) and the ``prefix`` headers
    (:func:`prefix_headers`)."""
    out = [(k.lower(), v) for k, v in upstream_headers if k.lower() not in _DROPPED_RESPONSE_HEADERS]
    if content_length is not None:
        out.append((b"content-length", str(content_length).encode()))
    out.append((ENDPOINT_HEADER, endpoint.encode()))
    if attempts is not None:
        out.append((ATTEMPTS_HEADER, str(attempts).encode()))
    out.extend(prefix)
    return out


def prefix_headers(match: PrefixMatch | None, prompt_tokens: int | None) -> list[tuple[bytes, bytes]]:
    """What the router expected of the serving endpoint's prefix cache: the index that knew
    (``x-burstsched-prefix-index``), the matched and total blocks (``x-burstsched-prefix-blocks``) and, from
    the precise index with the prompt's engine tokens known, the tokens the engine should find cached
    (``x-burstsched-predicted-cached-tokens``: whole blocks, at most ``prompt_tokens - 1``, as vLLM
    counts)."""
    if match is None:
        return []
    out = [
        (PREFIX_INDEX_HEADER, match.source.encode()),
        (PREFIX_BLOCKS_HEADER, f"{match.matched_blocks}/{match.total_blocks}".encode()),
    ]
    if match.source == "precise" and prompt_tokens is not None and match.block_tokens > 0:
        usable = max(0, (prompt_tokens - 1) // match.block_tokens)
        predicted = min(match.matched_blocks, usable) * match.block_tokens
        out.append((PREDICTED_CACHED_HEADER, str(predicted).encode()))
    return out


def predicted_ttft_header(seconds: float) -> tuple[bytes, bytes]:
    """``x-burstsched-predicted-ttft-ms``: the serving endpoint's learned time to first token for this
    request as it was sent (:class:`burstsched.framework.TtftEstimate`), for comparing with the real one."""
    return (PREDICTED_TTFT_HEADER, f"{seconds * 1000.0:.1f}".encode())
