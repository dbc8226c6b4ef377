"""Upstream proxying: headers, failover, streaming pass-through."""

from burstsched.dispatch.headers import (
    ATTEMPTS_HEADER,
    ENDPOINT_HEADER,
    client_response_headers,
    upstream_request_headers,
)
from burstsched.dispatch.proxy import DONE_EVENT, Dispatcher
from burstsched.dispatch.transport import LeanResponse, LeanTransport, Timeouts
from burstsched.dispatch.upstream import HttpxUpstream, Upstream, UpstreamResponse, getter, upstream_for

__all__ = [
    "ATTEMPTS_HEADER",
    "DONE_EVENT",
    "ENDPOINT_HEADER",
    "Dispatcher",
    "HttpxUpstream",
    "LeanResponse",
    "LeanTransport",
    "Timeouts",
    "Upstream",
    "UpstreamResponse",
    "client_response_headers",
    "getter",
    "upstream_for",
    "upstream_request_headers",
]
