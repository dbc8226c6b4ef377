"""The upstream client: every request the router sends to a replica goes through one :class:`UpstreamClient`.

Dispatch, health checks, ``/v1/models``, ``/metrics`` scrapes and ``/tokenize`` all share it. It is an
:class:`~burstsched.dispatch.upstream.Upstream` over aiohttp, which measured cheapest in client CPU per
request among the maintained asyncio HTTP clients (httpx's pool re-checks every idle connection on each
request). Each endpoint (scheme, host, port) gets its own ``aiohttp.ClientSession`` and keep-alive pool;
:class:`~burstsched.dispatch.slots.RequestSlots` caps the requests in flight across all of them.

Headers go out as given, plus ``Host`` and ``Content-Length`` (no ``User-Agent``, ``Accept``,
``Accept-Encoding`` or ``Content-Type`` of aiohttp's own); bodies come back as sent (no decompression), no
redirect is followed and no cookie kept. TLS verifies against the system's CAs by default (see
:func:`tls_context`); proxies come from the environment (:mod:`burstsched.dispatch.env_proxy`).

Timeouts (:data:`~burstsched.dispatch.upstream.Timeouts`): ``connect`` bounds opening a connection,
``read`` each wait for response bytes (the head, then every chunk), ``pool`` the wait for a free slot.
aiohttp has no write timeout of its own: the body is sent while the response head is awaited, so ``read``
bounds a replica that stops reading too.

Errors are httpx's ``TransportError`` family, which the dispatcher and the pool tell apart: ``ConnectError``
(refused, unresolvable, TLS refused), ``ConnectTimeout``, ``PoolTimeout``, ``ReadTimeout``,
``RemoteProtocolError`` (the replica closed the connection early or sent no HTTP), ``ReadError`` (other
socket errors). One failure is retried here, once: a connection found closing before any of the request was
written (a kept-alive connection the replica had just closed). Anything else may have reached the replica,
so the dispatcher decides (it fails over to another endpoint).
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from types import TracebackType

import aiohttp
import httpx
from yarl import URL

from burstsched.dispatch.env_proxy import EnvProxy, env_proxy
from burstsched.dispatch.slots import RequestSlots
from burstsched.dispatch.upstream import Timeouts, UpstreamResponse

DEFAULT_KEEPALIVE_S = 3.0
"""How long an idle connection is kept: below the 5 s after which uvicorn (vLLM's server) closes one, so the
router never sends a request on a connection the replica is closing."""

_SKIPPED_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_MAX_TARGETS = 4096


def tls_context(*, ca_file: str | None = None, verify: bool = True) -> ssl.SSLContext | bool:
    """What the client verifies replicas' certificates with: the system's CAs (``True``), a context trusting
    ``ca_file`` (e.g. a private CA's), or nothing at all (``verify=False``: self-signed certificates,
    testing only)."""
    if not verify:
        return False
    if ca_file is None:
        return True
    return ssl.create_default_context(cafile=ca_file)


@dataclass(slots=True)
class _Endpoint:
    """One replica's session and how to reach it."""

    session: aiohttp.ClientSession
    proxy: URL | None = None
    proxy_headers: dict[str, str] | None = None
    """For a proxy's CONNECT (https)."""
    own_headers: tuple[tuple[str, str], ...] = ()
    """Sent with every request (a plain-http proxy's credentials)."""

    def route_through(self, proxy: EnvProxy | None, scheme: str) -> None:
        if proxy is None:
            return
        self.proxy = proxy.url
        if scheme == "https":
            self.proxy_headers = proxy.headers
        elif proxy.headers:
            self.own_headers = tuple(proxy.headers.items())


class UpstreamClient:
    """Keep-alive HTTP/1.1 connections to the replicas (HTTP and HTTPS, IPv4 and IPv6), through aiohttp.

    ``max_connections`` caps the requests in flight (each holds a connection), ``keepalive`` off closes every
    connection after its response; ``tls``: see :func:`tls_context`; ``trust_env``: honour the
    environment's proxies. Use it as an async context manager, or call :meth:`aclose` when done.
    """

    def __init__(
        self,
        *,
        max_connections: int = 1024,
        keepalive: bool = True,
        keepalive_s: float = DEFAULT_KEEPALIVE_S,
        tls: ssl.SSLContext | bool = True,
        trust_env: bool = True,
    ) -> None:
        self._slots = RequestSlots(max_connections)
        self._keepalive_s = keepalive_s if keepalive else None
        self._tls = tls
        self._trust_env = trust_env
        self._endpoints: dict[tuple[str, str, int], _Endpoint] = {}
        self._targets: dict[str, tuple[_Endpoint, URL]] = {}
        self._timeouts: dict[tuple[float | None, float | None], aiohttp.ClientTimeout] = {}
        self._closed = False

    @property
    def in_flight(self) -> int:
        """Requests sent and not closed yet (each holds one of ``max_connections`` slots)."""
        return self._slots.taken

    @property
    def waiting(self) -> int:
        """Requests waiting for a free slot."""
        return self._slots.waiting

    async def __aenter__(self) -> UpstreamClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def request(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes, timeouts: Timeouts
    ) -> UpstreamResponse:
        """Send one request and return once its response head came; the caller must ``aclose`` it."""
        target = self._targets.get(url)
        if target is None:
            target = self._target(url)
        endpoint, parsed = target
        session = endpoint.session
        sent = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        sent.extend(endpoint.own_headers)
        data = body if body or method in _BODY_METHODS else None
        timeout = self._timeout(timeouts)
        await self._slots.acquire(timeouts.get("pool"))
        try:
            for attempt in (0, 1):
                try:
                    response = await session.request(
                        method,
                        parsed,
                        headers=sent,
                        data=data,
                        timeout=timeout,
                        allow_redirects=False,
                        proxy=endpoint.proxy,
                        proxy_headers=endpoint.proxy_headers,
                    )
                except aiohttp.ClientConnectionError as exc:
                    if attempt or not _unsent(exc):
                        raise
                    continue  # the replica had closed the connection before any of it was written
                return _Response(response, self._slots)
        except BaseException as exc:
            self._slots.release()
            mapped = _transport_error(exc)
            if mapped is None:
                raise
            raise mapped from exc
        raise AssertionError("unreachable")

    def _target(self, url: str) -> tuple[_Endpoint, URL]:
        if self._closed:
            raise httpx.ConnectError("the upstream client is closed")
        try:
            parsed = URL(url)
        except ValueError as exc:
            raise httpx.UnsupportedProtocol(f"not a URL: {url}: {exc}") from None
        if parsed.scheme not in ("http", "https") or not parsed.host or parsed.port is None:
            raise httpx.UnsupportedProtocol(f"not an http:// or https:// URL: {url}")
        key = (parsed.scheme, parsed.host, parsed.port)
        endpoint = self._endpoints.get(key)
        if endpoint is None:
            endpoint = self._endpoints[key] = self._endpoint(parsed)
        if len(self._targets) >= _MAX_TARGETS:
            self._targets.clear()
        self._targets[url] = endpoint, parsed
        return endpoint, parsed

    def _endpoint(self, url: URL) -> _Endpoint:
        if self._keepalive_s is None:
            connector = aiohttp.TCPConnector(limit=0, ssl=self._tls, force_close=True)
        else:
            connector = aiohttp.TCPConnector(limit=0, ssl=self._tls, keepalive_timeout=self._keepalive_s)
        session = aiohttp.ClientSession(
            connector=connector,
            skip_auto_headers=_SKIPPED_AUTO_HEADERS,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(),
        )
        endpoint = _Endpoint(session)
        if self._trust_env:
            endpoint.route_through(env_proxy(url), url.scheme)
        return endpoint

    def _timeout(self, timeouts: Timeouts) -> aiohttp.ClientTimeout:
        key = timeouts.get("connect"), timeouts.get("read")
        timeout = self._timeouts.get(key)
        if timeout is None:
            timeout = self._timeouts[key] = aiohttp.ClientTimeout(sock_connect=key[0], sock_read=key[1])
        return timeout

    async def aclose(self) -> None:
        """Close every connection; later requests fail with ``ConnectError``."""
        self._closed = True
        self._targets.clear()
        endpoints, self._endpoints = list(self._endpoints.values()), {}
        for endpoint in endpoints:
            await endpoint.session.close()


class _Response:
    """One response: its head, and its body as it arrives; closing it frees its slot (and, when the body
    was not read to its end, drops its connection)."""

    __slots__ = ("_closed", "_response", "_slots", "headers", "status")

    def __init__(self, response: aiohttp.ClientResponse, slots: RequestSlots) -> None:
        self.status = response.status
        self.headers = list(response.raw_headers)
        self._response = response
        self._slots = slots
        self._closed = False

    def iter_body(self) -> AsyncIterator[bytes]:
        return self._body()

    async def _body(self) -> AsyncIterator[bytes]:
        content = self._response.content
        try:
            while chunk := await content.readany():
                yield chunk
        except Exception as exc:
            mapped = _transport_error(exc)
            if mapped is None:
                raise
            raise mapped from exc

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._response.content.at_eof():
            self._response.release()
        else:
            self._response.close()
        self._slots.release()


def _unsent(exc: BaseException) -> bool:
    """Whether the request failed because its connection was already closing when it was to be written: the
    replica cannot have seen it (a kept-alive connection the replica closed as the request went out), so it
    may go once more. A connection lost after the request was written is not retried: the replica may have
    started on it, and the dispatcher fails over instead."""
    return isinstance(exc, aiohttp.ClientConnectionResetError) or isinstance(
        exc.__cause__, aiohttp.ClientConnectionResetError
    )


def _transport_error(exc: BaseException) -> httpx.TransportError | None:
    """httpx's error for aiohttp's ``exc`` (None: not a transport error, e.g. a cancellation)."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message)
    if isinstance(exc, TimeoutError):  # aiohttp's SocketTimeoutError: no bytes within the read timeout
        return httpx.ReadTimeout(message)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError("the replica closed the connection without sending a response")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(f"the replica's response body was cut short: {message}")
    if isinstance(exc, aiohttp.ClientResponseError):
        return httpx.RemoteProtocolError(f"malformed response: {exc.message}")
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return httpx.UnsupportedProtocol(message)
    if isinstance(exc, aiohttp.ClientError | OSError):
        return httpx.ReadError(f"{type(exc).__name__}: {message}")
    return None
