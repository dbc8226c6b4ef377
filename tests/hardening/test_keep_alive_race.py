"""A request that reaches an idle kept-alive connection as its keep-alive timer runs is served, not dropped.

On a busy event loop the timer can run before the loop reads a request that arrived in time (a timer due
runs before the loop polls its sockets). uvicorn's handler then closes the connection with the request
unread; the client sees the connection end without an answer and does not resend a POST. Here the test
makes that order happen for certain: it writes the request into the socket, then runs the timer's
handler before the event loop can read it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import anyio
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from burstsched.server.header_guard import guarded_protocol

pytestmark = pytest.mark.anyio

REQUEST = b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 2\r\n\r\n{}"


async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
    assert scope["type"] == "http"
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


class _Connection:
    """A guarded server protocol on one accepted 127.0.0.1 connection, and the client's socket."""

    def __init__(self, protocol: HttpToolsProtocol, client: socket.socket) -> None:
        self.protocol = protocol
        self.client = client

    async def response(self) -> bytes:
        """One whole response (its content-length is 2), or what came before the server closed."""
        loop = asyncio.get_running_loop()
        data = b""
        while not (b"\r\n\r\n" in data and data.endswith(b"ok")):
            chunk = await loop.sock_recv(self.client, 4096)
            if not chunk:
                return data
            data += chunk
        return data


@pytest.fixture
async def connection() -> AsyncIterator[_Connection]:
    config = uvicorn.Config(_answer, lifespan="off", log_level="warning")
    config.load()
    protocol_class = guarded_protocol(header_timeout_s=30.0, max_header_bytes=65_536, keep_alive_s=60.0)
    protocol = protocol_class(config=config, server_state=ServerState(), app_state={})
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
    client.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, accepted)
    try:
        yield _Connection(protocol, client)
    finally:
        transport.close()
        client.close()


async def test_a_request_waiting_when_the_keep_alive_timer_runs_is_served(connection: _Connection) -> None:
    with anyio.fail_after(10):
        connection.client.sendall(REQUEST)
        assert (await connection.response()).startswith(b"HTTP/1.1 200 ")
        assert connection.protocol.timeout_keep_alive_task is not None  # idle, kept alive
        connection.client.sendall(REQUEST)  # arrives; the loop has not read it yet ...
        connection.protocol.timeout_keep_alive_handler()  # ... when the keep-alive timer runs
        assert (await connection.response()).startswith(b"HTTP/1.1 200 ")


async def test_an_idle_connection_is_still_closed_when_its_timer_runs(connection: _Connection) -> None:
    with anyio.fail_after(10):
        connection.client.sendall(REQUEST)
        assert (await connection.response()).startswith(b"HTTP/1.1 200 ")
        connection.protocol.timeout_keep_alive_handler()
        assert await connection.response() == b""  # closed: end of stream, nothing more sent
