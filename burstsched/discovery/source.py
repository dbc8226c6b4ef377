"""What every discovery source is: an async iterator of the current endpoint set, one item per change."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncGenerator, Iterable
from typing import Protocol, runtime_checkable

import anyio

from burstsched.config import EndpointConfig


@runtime_checkable
class Discovery(Protocol):
    """A source of endpoints; ``source`` names it in ``/admin/endpoints`` and the metrics."""

    source: str

    def endpoint_sets(self) -> AsyncGenerator[list[EndpointConfig], None]:
        """The whole current set, first as soon as it is known, then again after each change (forever)."""
        ...


def address_name(address: str) -> str:
    """A stable endpoint name for an IP address: ``host-10-0-0-5``, ``host-fd00--5``."""
    return "host-" + address.replace(".", "-").replace(":", "-")


def address_url(scheme: str, address: str, port: int) -> str:
    """``scheme://address:port``, with an IPv6 literal in brackets."""
    try:
        if ipaddress.ip_address(address).version == 6:
            address = f"[{address}]"
    except ValueError:
        pass  # a host name
    return f"{scheme}://{address}:{port}"


EndpointKey = frozenset[tuple[str, str, frozenset[tuple[str, str]]]]


def endpoint_key(endpoints: Iterable[EndpointConfig]) -> EndpointKey:
    """What identifies a set of endpoints (names, URLs and labels), to tell a change from a repeat."""
    return frozenset((e.endpoint_name, e.url, frozenset(e.labels.items())) for e in endpoints)


class StaticDiscovery:
    """The configured list, once."""

    source = "static"

    def __init__(self, endpoints: Iterable[EndpointConfig]) -> None:
        self._endpoints = list(endpoints)

    async def endpoint_sets(self) -> AsyncGenerator[list[EndpointConfig], None]:
        yield list(self._endpoints)
        await anyio.sleep_forever()
