"""In-process HTTP between ASGI apps: streamed chunk by chunk, disconnects, failures, lifespan."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from burstsched.replay.asgi_io import AsgiUpstream, lifespan

pytestmark = pytest.mark.anyio

URL = "http://replica.test:8000"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class StreamingApp:
    """Sends its head, then one chunk per ``release``; records what it received."""

    def __init__(self) -> None:
        self.release = asyncio.Queue[bytes | None]()
        self.scopes: list[Scope] = []
        self.bodies: list[bytes] = []
        self.disconnected = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scopes.append(scope)
        message = await receive()
        self.bodies.append(message["body"])
        await send({"type": "http.response.start", "status": 201, "headers": [(b"x-a", b"1")]})
        watcher = asyncio.create_task(self._watch(receive))
        try:
            while (chunk := await self.release.get()) is not None:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()

    async def _watch(self, receive: Receive) -> None:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            self.disconnected.set()


async def test_the_body_streams_chunk_by_chunk_and_the_request_reaches_the_app() -> None:
    app = StreamingApp()
    upstream = AsgiUpstream({URL: app})
    response = await upstream.request(
        "POST", f"{URL}/v1/completions?x=1", [(b"X-Request-Id", b"r1")], b'{"a":1}', {}
    )
    assert response.status == 201 and (b"x-a", b"1") in response.headers
    scope = app.scopes[0]
    assert (scope["method"], scope["path"], scope["query_string"]) == ("POST", "/v1/completions", b"x=1")
    assert (b"x-request-id", b"r1") in scope["headers"]
    assert (b"host", b"replica.test:8000") in scope["headers"]
    assert app.bodies == [b'{"a":1}']
    body = response.iter_body()
    app.release.put_nowait(b"first")
    assert await body.__anext__() == b"first"  # before the second chunk exists
    app.release.put_nowait(b"second")
    app.release.put_nowait(None)
    assert [chunk async for chunk in body] == [b"second"]
    await response.aclose()


async def test_closing_a_response_early_is_a_client_disconnect() -> None:
    app = StreamingApp()
    response = await AsgiUpstream({URL: app}).request("GET", f"{URL}/s", [], b"", {})
    app.release.put_nowait(b"one")
    assert await response.iter_body().__anext__() == b"one"
    await response.aclose()
    assert app.disconnected.is_set()


async def test_an_unknown_authority_is_refused_like_a_connection() -> None:
    with pytest.raises(httpx.ConnectError):
        await AsgiUpstream({URL: StreamingApp()}).request("GET", "http://other:1/", [], b"", {})


async def test_an_app_failing_before_its_head_or_mid_body_shows_as_a_transport_error() -> None:
    async def before(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    async def midway(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})
        raise RuntimeError("boom")

    upstream = AsgiUpstream({URL: before, "http://mid:1": midway})
    with pytest.raises(httpx.RemoteProtocolError):
        await upstream.request("GET", f"{URL}/", [], b"", {})
    response = await upstream.request("GET", "http://mid:1/", [], b"", {})
    chunks: list[bytes] = []
    with pytest.raises(httpx.ReadError):
        async for chunk in response.iter_body():
            chunks.append(chunk)
    assert chunks == [b"part"]
    await response.aclose()


async def test_lifespan_runs_startup_and_shutdown_around_the_block() -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "lifespan"
        while True:
            message = await receive()
            seen.append(message["type"])
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return

    async with lifespan(app):
        assert seen == ["lifespan.startup"]
    assert seen == ["lifespan.startup", "lifespan.shutdown"]


async def test_a_failed_startup_raises() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no endpoints"})

    with pytest.raises(RuntimeError, match="no endpoints"):
        async with lifespan(app):
            pass


def _unused(*_: Any) -> None: ...
