"""A lean HTTP/1.1 transport for the upstream ``httpx.AsyncClient``: keep-alive pools and a C parser.

httpx's default pool re-checks every idle connection of the pool (a ``poll`` system call each) whenever a
request is assigned, which costs milliseconds of CPU per request once dozens of connections are open. This
transport keeps a LIFO stack of idle connections per origin, parses responses with ``httptools`` and writes
each request in one ``write``. It runs on asyncio only (uvicorn's loop) and speaks plain HTTP/1.1 (and
HTTPS) without proxies, which is all the router needs from its replicas. Tests inject another transport
through the same seam.

Errors map to httpx's: ``ConnectError``/``ConnectTimeout`` (connecting), ``ReadTimeout`` (no bytes for the
read timeout), ``WriteError``, ``RemoteProtocolError`` (the peer closed early or sent garbage),
``PoolTimeout`` (no free connection within the pool timeout).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import cast

import httptools
import httpx

_READ_HIGH_WATER = 256 * 1024
_READ_LOW_WATER = 64 * 1024

Origin = tuple[str, str, int]


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection; carries one exchange at a time."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.expires_at = 0.0
        self.reused = False
        self.has_response_bytes = False
        self._loop = asyncio.get_running_loop()
        self._parser: httptools.HttpResponseParser | None = None
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_done = False
        self._complete = False
        self._keep_alive = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._reading_paused = False
        self._error: httpx.TransportError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._writing_paused = False

    # --- asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are no asyncio subclasses

    def data_received(self, data: bytes) -> None:
        if self._parser is None:  # bytes while idle: the connection cannot be trusted any more
            self._close()
            return
        self.has_response_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed response: {exc}"))
            self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._parser is not None and not self._complete:
            if self._head_done:
                self._fail(
                    httpx.RemoteProtocolError("peer closed connection without sending complete message body")
                )
            else:
                self._fail(httpx.RemoteProtocolError("Server disconnected without sending a response."))
        self._wake()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # --- httptools callbacks ------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        self._status = self._parser.get_status_code()
        self._keep_alive = self._parser.should_keep_alive()
        self._head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(bytes(body))
        self._buffered += len(body)
        if self._buffered > _READ_HIGH_WATER and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._complete = True
        self._wake()

    # --- the exchange -------------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: httpx.TransportError) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection at once (an exchange was abandoned half way)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    async def _wait(self, timeout_s: float | None) -> None:
        self._waiter = self._loop.create_future()
        try:
            if timeout_s is None:
                await self._waiter
            else:
                async with asyncio.timeout(timeout_s):
                    await self._waiter
        except TimeoutError:
            raise httpx.ReadTimeout(f"no response bytes for {timeout_s} s") from None
        finally:
            self._waiter = None

    def begin(self) -> None:
        """Start an exchange: a fresh parser and response state."""
        self._parser = httptools.HttpResponseParser(self)
        self._status, self._headers, self._head_done, self._complete = 0, [], False, False
        self._chunks.clear()
        self._buffered, self._error = 0, None
        self.has_response_bytes = False

    def prepare_idle(self) -> None:
        """Between exchanges: any byte the server sends now closes the connection."""
        self._parser = None

    async def send(self, data: bytes, write_timeout: float | None) -> None:
        """Write request bytes, waiting while the transport's buffer is full."""
        if self.closed or self.transport is None or self.transport.is_closing():
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        try:
            self.transport.write(data)
        except (OSError, RuntimeError) as exc:
            raise httpx.WriteError(str(exc)) from exc
        if self._writing_paused:
            self._drain_waiter = self._loop.create_future()
            try:
                async with asyncio.timeout(write_timeout):
                    await self._drain_waiter
            except TimeoutError:
                raise httpx.WriteTimeout(f"request not sent within {write_timeout} s") from None
            finally:
                self._drain_waiter = None

    async def read_head(self, read_timeout: float | None) -> tuple[int, list[tuple[bytes, bytes]]]:
        while not self._head_done:
            if self._error is not None:
                raise self._error
            await self._wait(read_timeout)
        return self._status, self._headers

    async def body(self, read_timeout: float | None) -> AsyncIterator[bytes]:
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._reading_paused and self._buffered < _READ_LOW_WATER and self.transport is not None:
                    self._reading_paused = False
                    self.transport.resume_reading()
                yield chunk
                continue
            if self._complete:
                return
            if self._error is not None:
                raise self._error
            await self._wait(read_timeout)

    @property
    def reusable(self) -> bool:
        """Whether the finished exchange left the connection fit for another one."""
        return self._complete and self._keep_alive and not self.closed and self._error is None


class _ResponseStream(httpx.AsyncByteStream):
    """The response body for httpx; closing it returns the connection to the pool (or drops it)."""

    def __init__(self, pool: LeanTransport, connection: _Connection, read_timeout: float | None) -> None:
        self._pool = pool
        self._connection = connection
        self._read_timeout = read_timeout
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._connection.body(self._read_timeout):
            yield chunk

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self._pool._release(self._connection)


class LeanResponse:
    """A response from :meth:`LeanTransport.request` (the dispatcher's fast path, no httpx objects)."""

    __slots__ = ("_connection", "_pool", "_read_timeout", "_released", "headers", "status")

    def __init__(
        self,
        pool: LeanTransport,
        connection: _Connection,
        status: int,
        headers: list[tuple[bytes, bytes]],
        read_timeout: float | None,
    ) -> None:
        self.status = status
        self.headers = headers
        self._pool = pool
        self._connection = connection
        self._read_timeout = read_timeout
        self._released = False

    def iter_body(self) -> AsyncIterator[bytes]:
        return self._connection.body(self._read_timeout)

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self._pool._release(self._connection)


Timeouts = Mapping[str, float | None]
"""httpx's timeout dictionary: ``connect``, ``read``, ``write``, ``pool`` in seconds (None: no limit)."""


class LeanTransport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 connection pools per origin, for ``httpx.AsyncClient(transport=...)``.

    :meth:`request` is the same exchange without httpx's request and response objects.
    """

    def __init__(
        self,
        *,
        max_connections: int | None = 1024,
        max_keepalive_connections: int = 256,
        keepalive_expiry: float = 3.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._max_connections = max_connections
        self._max_keepalive = max_keepalive_connections
        self._expiry = keepalive_expiry
        self._ssl_context = ssl_context
        self._idle: dict[Origin, list[_Connection]] = {}
        self._idle_count = 0
        self._open = 0
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False
        self._targets: dict[str, tuple[Origin, bytes, bytes]] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        port = url.port or (443 if url.scheme == "https" else 80)
        origin: Origin = (url.scheme, url.host, port)
        body = await request.aread()
        head = _head(request.method.encode(), url.raw_path, request.headers.raw, body)
        timeouts: Timeouts = request.extensions.get("timeout", {})
        try:
            connection, status, headers = await self._exchange(origin, head, body, timeouts)
        except httpx.TransportError as exc:
            exc.request = request
            raise
        return httpx.Response(
            status,
            headers=headers,
            stream=_ResponseStream(self, connection, timeouts.get("read")),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def request(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes, timeouts: Timeouts
    ) -> LeanResponse:
        """Send one request; ``headers`` as given (plus ``host`` and ``content-length``)."""
        target = self._targets.get(url)
        if target is None:
            parsed = httpx.URL(url)
            port = parsed.port or (443 if parsed.scheme == "https" else 80)
            host_header = parsed.host if parsed.port is None else f"{parsed.host}:{parsed.port}"
            target = (parsed.scheme, parsed.host, port), parsed.raw_path, host_header.encode()
            self._targets[url] = target
        origin, path, host = target
        head = _head(method.encode(), path, [(b"host", host), *headers], body)
        connection, status, response_headers = await self._exchange(origin, head, body, timeouts)
        return LeanResponse(self, connection, status, response_headers, timeouts.get("read"))

    async def _exchange(
        self, origin: Origin, head: bytes, body: bytes, timeouts: Timeouts
    ) -> tuple[_Connection, int, list[tuple[bytes, bytes]]]:
        if self._closed:
            raise httpx.ConnectError("the transport is closed")
        data = head + body if len(body) < 65536 else None
        write_timeout = timeouts.get("write")
        for attempt in (0, 1):
            connection = self._take_idle(origin)
            if connection is None:
                connection = await self._connect(origin, timeouts)
            try:
                connection.begin()
                if data is not None:
                    await connection.send(data, write_timeout)
                else:
                    await connection.send(head, write_timeout)
                    await connection.send(body, write_timeout)
                status, headers = await connection.read_head(timeouts.get("read"))
            except httpx.RemoteProtocolError:
                self._drop(connection)
                # an idle connection the server had already closed: retry once on a fresh one
                if attempt == 0 and connection.reused and not connection.has_response_bytes:
                    continue
                raise
            except BaseException:
                self._drop(connection)
                raise
            return connection, status, headers
        raise AssertionError("unreachable")

    # --- the pool -----------------------------------------------------------------------------------

    def _take_idle(self, origin: Origin) -> _Connection | None:
        stack = self._idle.get(origin)
        now = time.monotonic()
        while stack:
            connection = stack.pop()
            self._idle_count -= 1
            if connection.closed or connection.expires_at < now or connection.transport is None:
                self._drop(connection)
                continue
            if connection.transport.is_closing():
                self._drop(connection)
                continue
            connection.reused = True
            return connection
        return None

    async def _connect(self, origin: Origin, timeouts: Timeouts) -> _Connection:
        await self._reserve_slot(timeouts.get("pool"))
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        ssl_arg: ssl.SSLContext | None = None
        if scheme == "https":
            ssl_arg = self._ssl_context or ssl.create_default_context()
        try:
            async with asyncio.timeout(timeouts.get("connect")):
                _, connection = await loop.create_connection(
                    lambda: _Connection(origin),
                    host,
                    port,
                    ssl=ssl_arg,
                    server_hostname=host if ssl_arg else None,
                )
        except TimeoutError:
            self._free_slot()
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as exc:
            self._free_slot()
            raise httpx.ConnectError(str(exc) or f"cannot connect to {host}:{port}") from exc
        except BaseException:
            self._free_slot()
            raise
        return connection

    async def _reserve_slot(self, pool_timeout: float | None) -> None:
        if self._max_connections is None or self._open < self._max_connections:
            self._open += 1
            return
        if self._idle_count:  # make room by closing the oldest idle connection anywhere
            for stack in self._idle.values():
                if stack:
                    victim = stack.pop(0)
                    self._idle_count -= 1
                    victim.abort()
                    return  # its slot passes to us: the count stays
        waiter = asyncio.get_running_loop().create_future()
        self._slot_waiters.append(waiter)
        try:
            async with asyncio.timeout(pool_timeout):
                await waiter
        except TimeoutError:
            raise httpx.PoolTimeout("no free upstream connection") from None
        finally:
            if waiter in self._slot_waiters:
                self._slot_waiters.remove(waiter)

    def _free_slot(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the waiter: the count stays
                return
        self._open -= 1

    def _drop(self, connection: _Connection) -> None:
        connection.abort()
        self._free_slot()

    def _release(self, connection: _Connection) -> None:
        if self._closed or not connection.reusable or self._idle_count >= self._max_keepalive:
            self._drop(connection)
            return
        connection.expires_at = time.monotonic() + self._expiry
        connection.prepare_idle()
        self._idle.setdefault(connection.origin, []).append(connection)
        self._idle_count += 1

    async def aclose(self) -> None:
        self._closed = True
        for stack in self._idle.values():
            for connection in stack:
                connection.abort()
        self._idle.clear()
        self._idle_count = 0


def _head(method: bytes, target: bytes, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> bytes:
    """The request line and headers; a body is always sent whole, with its length."""
    lines = [method + b" " + target + b" HTTP/1.1\r\n"]
    for name, value in headers:
        lower = name.lower()
        if lower != b"content-length" and lower != b"transfer-encoding":
            lines.append(name + b": " + value + b"\r\n")
    if body or method in (b"POST", b"PUT", b"PATCH"):
        lines.append(b"content-length: " + str(len(body)).encode() + b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)
