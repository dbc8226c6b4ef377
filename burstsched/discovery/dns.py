"""DNS discovery: a name (a headless Service) resolved every ``interval``; each address is an endpoint.

Resolution goes through the event loop's resolver (``loop.getaddrinfo``) unless a resolver is injected. A
failed resolution keeps the last set (a DNS hiccup must not empty the pool); an empty answer empties it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncGenerator, Awaitable, Callable

import anyio

from burstsched.config import EndpointConfig
from burstsched.discovery.source import EndpointKey, address_name, address_url, endpoint_key

log = logging.getLogger(__name__)

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""``resolve(host, port) -> addresses``; raises ``OSError`` when the name does not resolve."""


async def loop_resolver(host: str, port: int) -> list[str]:
    """The A/AAAA addresses of ``host`` from the running loop's resolver, sorted, no duplicates."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class DnsDiscovery:
    """Endpoints ``host-<address>`` at ``scheme://address:port`` for every address of ``host``."""

    source = "dns"

    def __init__(
        self,
        host: str,
        port: int,
        *,
        interval_s: float,
        scheme: str = "http",
        resolver: Resolver = loop_resolver,
    ) -> None:
        self._host = host
        self._port = port
        self._interval_s = interval_s
        self._scheme = scheme
        self._resolve = resolver

    def endpoints(self, addresses: list[str]) -> list[EndpointConfig]:
        return [
            EndpointConfig(url=address_url(self._scheme, a, self._port), name=address_name(a))
            for a in sorted(set(addresses))
        ]

    async def endpoint_sets(self) -> AsyncGenerator[list[EndpointConfig], None]:
        last: EndpointKey | None = None
        while True:
            try:
                addresses = await self._resolve(self._host, self._port)
            except OSError as exc:
                log.warning("discovery: %s does not resolve (%s); keeping the last set", self._host, exc)
            else:
                endpoints = self.endpoints(addresses)
                key = endpoint_key(endpoints)
                if key != last:
                    last = key
                    yield endpoints
            await anyio.sleep(self._interval_s)
