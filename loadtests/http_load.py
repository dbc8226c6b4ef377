"""Closed-loop HTTP/1.1 load over keep-alive raw sockets, costing the load generator as little CPU as it can.

Each :class:`Connection` sends one prebuilt request at a time and reads the whole answer (content length or
chunked); :func:`closed_loop` runs connections back to back for a fixed time and returns every latency. No
HTTP library: an ``asyncio.Protocol`` that only finds where each response ends.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

from loadtests.fast_backend import header_value

MAX_HEAD_BYTES = 65536


class ResponseError(ConnectionError):
    """The connection ended or sent something that is not an HTTP/1.1 response."""


def post_request(host: str, port: int, path: str, body: bytes) -> bytes:
    """The bytes of a keep-alive ``POST`` of a JSON body."""
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def response_end(buffer: bytes | bytearray) -> tuple[int, int] | None:
    """(status, offset just past the first whole response in ``buffer``), or None while it is incomplete.

    Raises :class:`ResponseError` for what cannot be an HTTP/1.1 response."""
    head_end = buffer.find(b"\r\n\r\n")
    if head_end < 0:
        if len(buffer) > MAX_HEAD_BYTES:
            raise ResponseError("response head too long")
        return None
    head = bytes(buffer[:head_end]).lower()
    try:
        status = int(head[9:12])
    except ValueError as exc:
        raise ResponseError(f"not an HTTP response: {bytes(buffer[:40])!r}") from exc
    body_start = head_end + 4
    length = header_value(head, b"content-length")
    if length is not None:
        end = body_start + int(length)
        return (status, end) if len(buffer) >= end else None
    if header_value(head, b"transfer-encoding") == b"chunked":
        pos = body_start
        while True:
            line_end = buffer.find(b"\r\n", pos)
            if line_end < 0:
                return None
            try:
                size = int(bytes(buffer[pos:line_end]).split(b";", 1)[0], 16)
            except ValueError as exc:
                raise ResponseError("bad chunk size") from exc
            pos = line_end + 2
            if size == 0:
                trailer_end = buffer.find(b"\r\n\r\n", pos - 2)
                return (status, trailer_end + 4) if trailer_end >= 0 else None
            pos += size + 2
            if len(buffer) < pos:
                return None
    if status in (204, 304) or 100 <= status < 200:
        return status, body_start
    raise ResponseError("response without a length")


class _ClientProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = bytearray()
        self.waiter: asyncio.Future[int] | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are no subclasses

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        try:
            done = response_end(self.buffer)
        except ResponseError as exc:
            waiter.set_exception(exc)
            return
        if done is not None:
            del self.buffer[: done[1]]
            waiter.set_result(done[0])

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ResponseError(f"connection lost: {exc}"))


class Connection:
    """One keep-alive connection sending the same request again and again (reconnecting when it breaks)."""

    def __init__(self, host: str, port: int, request: bytes) -> None:
        self._host, self._port, self._request = host, port, request
        self._protocol: _ClientProtocol | None = None

    async def open(self) -> None:
        if self._protocol is None or self._protocol.closed:
            loop = asyncio.get_running_loop()
            _, self._protocol = await loop.create_connection(_ClientProtocol, self._host, self._port)

    async def request(self, timeout_s: float) -> int:
        """Send the request, wait for the whole response; its status. Raises OSError or TimeoutError."""
        await self.open()
        protocol = self._protocol
        assert protocol is not None and protocol.transport is not None
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        protocol.waiter = waiter
        protocol.transport.write(self._request)
        try:
            return await asyncio.wait_for(waiter, timeout_s)
        except BaseException:
            self.close()
            raise
        finally:
            protocol.waiter = None

    def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()


@dataclass
class LoadResult:
    """What one closed-loop run measured."""

    latencies: list[float] = field(default_factory=list)
    """Seconds, one per successful (HTTP 200) request."""
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    """Count of each non-200 status (0: a broken connection or a timeout)."""
    seconds: float = 0.0

    def add(self, other: LoadResult) -> None:
        self.latencies += other.latencies
        self.errors += other.errors
        for status, count in other.statuses.items():
            self.statuses[status] = self.statuses.get(status, 0) + count
        self.seconds += other.seconds


async def closed_loop(
    connections: list[Connection], seconds: float, *, request_timeout_s: float = 10.0
) -> LoadResult:
    """Each connection sends requests back to back for ``seconds``; at most ``seconds`` + one timeout."""
    result = LoadResult()
    latencies = result.latencies
    clock = time.perf_counter
    started = clock()
    deadline = started + seconds

    def failed(status: int) -> None:
        result.errors += 1
        result.statuses[status] = result.statuses.get(status, 0) + 1

    async def one_client(connection: Connection) -> None:
        while True:
            sent = clock()
            if sent >= deadline:
                return
            try:
                status = await connection.request(request_timeout_s)
            except (OSError, TimeoutError):
                failed(0)
                continue
            if status == 200:
                latencies.append(clock() - sent)
            else:
                failed(status)

    await asyncio.gather(*(one_client(c) for c in connections))
    result.seconds = clock() - started
    return result


def percentile(sorted_values: list[float], share: float) -> float:
    """The nearest-rank percentile of already sorted values (nan when there are none)."""
    if not sorted_values:
        return float("nan")
    rank = min(len(sorted_values) - 1, max(0, math.ceil(share * len(sorted_values)) - 1))
    return sorted_values[rank]
