"""The router's view of upstream I/O: send one request, get status, headers and a body stream.

:class:`~burstsched.dispatch.client.UpstreamClient` implements it over aiohttp (the production client);
any httpx transport, e.g. ``httpx.MockTransport`` in tests, is adapted by :class:`HttpxUpstream`. Errors
are httpx's ``TransportError`` family either way. :func:`getter` and :func:`poster` are the simple
exchanges the pool (health, models, scrapes) and the remote tokenizer make over the same upstream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Protocol

import httpx

Timeouts = Mapping[str, float | None]
"""httpx's timeout dictionary: ``connect``, ``read``, ``write``, ``pool`` in seconds (None: no limit)."""

_JSON = [(b"content-type", b"application/json")]


class UpstreamResponse(Protocol):
    """A response whose body is still to be read; ``aclose`` must be called once done with it."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> list[tuple[bytes, bytes]]: ...

    def iter_body(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Upstream(Protocol):
    """Sends one request to a replica."""

    async def request(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes, timeouts: Timeouts
    ) -> UpstreamResponse: ...


class _HttpxResponse:
    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.headers = list(response.headers.raw)

    async def iter_body(self) -> AsyncIterator[bytes]:
        if self._response.is_stream_consumed:  # a response built with its content (e.g. by MockTransport)
            yield self._response.content
            return
        async for chunk in self._response.aiter_raw():
            yield chunk

    async def aclose(self) -> None:
        await self._response.aclose()


class HttpxUpstream:
    """:class:`Upstream` over any ``httpx.AsyncBaseTransport``."""

    def __init__(self, transport: httpx.AsyncBaseTransport) -> None:
        self._transport = transport

    async def request(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes, timeouts: Timeouts
    ) -> UpstreamResponse:
        request = httpx.Request(
            method, url, headers=headers, content=body, extensions={"timeout": dict(timeouts)}
        )
        return _HttpxResponse(await self._transport.handle_async_request(request))


def getter(upstream: Upstream) -> Callable[[str, float], Awaitable[tuple[int, bytes]]]:
    """``get(url, timeout_s) -> (status, body)`` over ``upstream``, for the pool's checks and scrapes."""

    async def get(url: str, timeout_s: float) -> tuple[int, bytes]:
        return await _exchange(upstream, "GET", url, [], b"", timeout_s)

    return get


def poster(upstream: Upstream) -> Callable[[str, bytes, float], Awaitable[tuple[int, bytes]]]:
    """``post(url, json_body, timeout_s) -> (status, body)`` over ``upstream``, for the remote tokenizer."""

    async def post(url: str, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        return await _exchange(upstream, "POST", url, _JSON, body, timeout_s)

    return post


async def _exchange(
    upstream: Upstream,
    method: str,
    url: str,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    timeout_s: float,
) -> tuple[int, bytes]:
    """One whole exchange within ``timeout_s``; raises httpx's transport errors (``ReadTimeout`` when the
    time is up)."""
    timeouts = {"connect": timeout_s, "read": timeout_s, "write": timeout_s, "pool": timeout_s}
    try:
        async with asyncio.timeout(timeout_s):
            response = await upstream.request(method, url, headers, body, timeouts)
            try:
                return response.status, b"".join([chunk async for chunk in response.iter_body()])
            finally:
                await response.aclose()
    except TimeoutError:
        raise httpx.ReadTimeout(f"{method} {url} took longer than {timeout_s} s") from None
