"""The lean upstream transport against a raw asyncio HTTP server whose every byte the test controls."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest

from burstsched.dispatch import LeanTransport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]
"""Answers one request (its head already read); returns whether to keep the connection open."""

TIMEOUTS = {"connect": 2.0, "read": 2.0, "write": 2.0, "pool": 2.0}


class RawServer:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed = 0
        self.requests = 0
        self.url = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                self.requests += 1
                if not await self.handler(reader, writer, self.requests):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self.closed += 1


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[RawServer]:
    server = RawServer(handler)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}"
    async with listener:
        yield server


async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
    body = f"response {n}".encode()
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    )
    await writer.drain()
    return True


async def _get(transport: LeanTransport, url: str, **timeouts: float) -> tuple[int, bytes]:
    response = await transport.request("GET", url, [], b"", {**TIMEOUTS, **timeouts})
    try:
        return response.status, b"".join([chunk async for chunk in response.iter_body()])
    finally:
        await response.aclose()


@pytest.mark.anyio
async def test_keep_alive_reuses_one_connection() -> None:
    transport = LeanTransport()
    async with raw_server(ok) as server:
        for n in range(1, 6):
            assert await _get(transport, server.url + "/x") == (200, f"response {n}".encode())
        assert server.connections == 1
    await transport.aclose()


@pytest.mark.anyio
async def test_chunked_body_through_httpx_client() -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        )
        await writer.drain()
        return True

    async with raw_server(chunked) as server, httpx.AsyncClient(transport=LeanTransport()) as client:
        response = await client.post(server.url + "/y", json={"a": 1})
        assert response.status_code == 200 and response.text == "hello world"
        assert (await client.get(server.url + "/y")).text == "hello world"
        assert server.connections == 1


@pytest.mark.anyio
async def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        await ok(reader, writer, n)
        return False  # close after each response, without saying so

    transport = LeanTransport()
    async with raw_server(once) as server:
        assert (await _get(transport, server.url))[0] == 200
        with anyio.fail_after(5):
            while server.closed < 1:  # noqa: ASYNC110 - the server's own state, on this loop
                await anyio.sleep(0.01)
        assert (await _get(transport, server.url))[0] == 200
        assert server.connections == 2
    await transport.aclose()


@pytest.mark.anyio
async def test_errors_map_to_httpx_exceptions() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        await anyio.sleep(5)
        return False

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        return False

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        return False

    transport = LeanTransport()
    with anyio.fail_after(10):
        async with raw_server(silent) as server:
            with pytest.raises(httpx.ReadTimeout):
                await _get(transport, server.url, read=0.1)
        async with raw_server(cut) as server:
            with pytest.raises(httpx.RemoteProtocolError, match="complete message body"):
                await _get(transport, server.url)
        async with raw_server(garbage) as server:
            with pytest.raises(httpx.RemoteProtocolError):
                await _get(transport, server.url)
        async with raw_server(ok) as server:
            url = server.url
        with pytest.raises(httpx.ConnectError):
            await _get(transport, url)
    await transport.aclose()


@pytest.mark.anyio
async def test_pool_limit_queues_then_times_out() -> None:
    release = anyio.Event()
    holding = anyio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        holding.set()
        await release.wait()
        return await ok(reader, writer, n)

    transport = LeanTransport(max_connections=1)
    with anyio.fail_after(10):
        async with raw_server(slow) as server, anyio.create_task_group() as tg:
            results: list[tuple[int, bytes]] = []

            async def first() -> None:
                results.append(await _get(transport, server.url))

            tg.start_soon(first)
            await holding.wait()  # the first request holds the only connection
            with pytest.raises(httpx.PoolTimeout):
                await _get(transport, server.url, pool=0.05)
            release.set()
        assert results == [(200, b"response 1")]
        async with raw_server(ok) as server:  # the slot came back: a new origin can connect
            assert (await _get(transport, server.url))[0] == 200
    await transport.aclose()
