"""Upstream proxying: headers, failover, streaming pass-through."""

from burstsched.dispatch.client import UpstreamClient, tls_context
from burstsched.dispatch.headers import (
    ATTEMPTS_HEADER,
    ENDPOINT_HEADER,
    client_response_headers,
    upstream_request_headers,
)
from burstsched.dispatch.prewarm import Prewarmer
from burstsched.dispatch.proxy import DONE_EVENT, Dispatcher, Served
from burstsched.dispatch.upstream import HttpxUpstream, Timeouts, Upstream, UpstreamResponse, getter, poster

__all__ = [
    "ATTEMPTS_HEADER",
    "DONE_EVENT",
    "ENDPOINT_HEADER",
    "Dispatcher",
    "HttpxUpstream",
    "Prewarmer",
    "Served",
    "Timeouts",
    "Upstream",
    "UpstreamClient",
    "UpstreamResponse",
    "client_response_headers",
    "getter",
    "poster",
    "tls_context",
    "upstream_request_headers",
]
