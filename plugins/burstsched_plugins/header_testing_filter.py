"""``header-based-testing-filter``: the Gateway API Inference Extension conformance suite's endpoint steering.

For conformance testing only; it does nothing unless a config lists it (and puts it in the profile). The
suite steers each request to chosen model servers with the request header ``test-epp-endpoint-selection``:
a comma-separated list of addresses, each ``IP`` or ``IP:PORT`` (IPv6 as ``[IP]:PORT``; a bare IPv6 may be
bracketed or not). The filter keeps the endpoints the list names, in the list's order, each once:

- ``IP:PORT`` keeps the endpoint at exactly that address;
- a bare ``IP`` keeps every endpoint at that IP, whatever its port (the data-parallel case: one pod, several
  ranks on several ports);
- blank items and spaces around items are ignored; a header absent or blank keeps every endpoint.

The type name, the header and the matching are those of the conformance suite's test picker
(kubernetes-sigs/gateway-api-inference-extension: ``HeaderBasedTestingFilter`` in
pkg/epp/framework/plugins/scheduling/test/filter/request_header_based_filter.go, listed as
``header-based-testing-filter`` in conformance/resources/base.yaml, both as of commit a70292c1^, the parent
of the commit that moved the suite to its lightweight picker; the bare-IP-matches-every-port rule is that
lightweight picker's, pkg/lwepp/handlers/request.go at 84436a96). One difference, from burstsched's
scheduler rather than this filter: when the list names no endpoint of the pool, the suite's pickers have no
candidate and answer 503, where burstsched's filters fail open and every endpoint stays a candidate.

Use it with admission off (``admission: enabled: false``): a burst window places requests sharing a prefix
together, whatever each one's header says.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from urllib.parse import urlsplit

from burstsched.framework import CycleState, EndpointSnapshot, PluginContext, PluginParameters, SchedRequest

HEADER = "test-epp-endpoint-selection"


class HeaderBasedTestingParameters(PluginParameters):
    """No parameters: the header and its syntax are fixed by the conformance suite."""


def _host(text: str) -> str:
    """An IP in one spelling (brackets dropped, IPv6 compressed); other text as given, lower case."""
    bare = text.strip().strip("[]")
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        return bare.lower()


def _selector(item: str) -> tuple[str, str | None]:
    """``(host, port)`` of one list item; port None for a bare IP (also a bare unbracketed IPv6)."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        return _host(host), (rest[1:] if rest.startswith(":") and rest[1:] else None)
    if item.count(":") == 1:
        host, _, port = item.partition(":")
        return _host(host), port.strip() or None
    return _host(item), None


def endpoint_host_port(url: str) -> tuple[str, str]:
    """The host (as :func:`_host` spells it) and port an endpoint's base URL connects to."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return _host(parts.hostname or ""), str(port)


class HeaderBasedTestingFilter:
    """Keeps the endpoints named by the ``test-epp-endpoint-selection`` request header."""

    Parameters = HeaderBasedTestingParameters

    def __init__(self, name: str, parameters: HeaderBasedTestingParameters, context: PluginContext) -> None:
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    @property
    def request_headers(self) -> tuple[str, ...]:
        return (HEADER,)

    def filter(
        self, request: SchedRequest, endpoints: Sequence[EndpointSnapshot], state: CycleState
    ) -> Sequence[EndpointSnapshot]:
        value = request.header(HEADER)
        if value is None or not value.strip():
            return endpoints
        addresses = [(e, endpoint_host_port(e.url)) for e in endpoints]
        kept: list[EndpointSnapshot] = []
        seen: set[str] = set()
        for raw in value.split(","):
            item = raw.strip()
            if not item:
                continue
            host, port = _selector(item)
            for endpoint, (e_host, e_port) in addresses:
                if e_host == host and port in (None, e_port) and endpoint.name not in seen:
                    seen.add(endpoint.name)
                    kept.append(endpoint)
        return kept
