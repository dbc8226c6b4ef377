"""HTTP between in-process ASGI apps, streamed: the router's upstream and the replay's client, no sockets.

:class:`AsgiUpstream` implements the router's :class:`~burstsched.dispatch.upstream.Upstream` over a map of
``scheme://host:port`` → ASGI app. A response's head comes back once the app sends it and its body chunk by
chunk as the app sends them (httpx's ``ASGITransport`` waits for the whole body, which would hide every
first token). Closing a response early is a client disconnect: the app's ``receive`` answers
``http.disconnect``, and an app still running after that is cancelled. An unknown authority is refused as
a connection would be (``httpx.ConnectError``); an app that fails before its head is a protocol error, and
one that fails mid-body a read error, as the router would see them over a socket. Timeouts are not applied
(the router applies its own first-byte and request deadlines).

:func:`lifespan` runs an app's ASGI lifespan around a block, as a server does around serving.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx
from starlette.types import ASGIApp, Message

from burstsched.dispatch.upstream import Timeouts, UpstreamResponse

_END = b""
_CLIENT = ("127.0.0.1", 1)


def authority(url: str) -> str:
    """``scheme://host:port`` of ``url`` (the key of :class:`AsgiUpstream`'s map)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


class _Exchange:
    """One request to an app: its task, the head once sent, the body chunks as they come."""

    def __init__(self, app: ASGIApp, scope: dict[str, Any], body: bytes) -> None:
        self._body: bytes | None = body
        self._disconnected = asyncio.Event()
        self._head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] = (
            asyncio.get_running_loop().create_future()
        )
        self._chunks: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
        self._ended = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._task = asyncio.create_task(self._run(app, scope))

    async def _receive(self) -> Message:
        body, self._body = self._body, None
        if body is not None:
            return {"type": "http.request", "body": body, "more_body": False}
        await self._disconnected.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if self._disconnected.is_set():
            raise OSError("client disconnected")
        kind = message["type"]
        if kind == "http.response.start":
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", [])]
            self._head.set_result((int(message["status"]), headers))
        elif kind == "http.response.body":
            chunk = bytes(message.get("body", b""))
            if chunk:
                self._chunks.put_nowait(chunk)
            if not message.get("more_body", False):
                self._ended = True
                self._chunks.put_nowait(_END)

    async def _run(self, app: ASGIApp, scope: dict[str, Any]) -> None:
        try:
            await app(scope, self._receive, self._send)
        except Exception as exc:  # the app failed: the caller sees what a broken connection shows
            if not self._head.done():
                self._head.set_exception(httpx.RemoteProtocolError(f"app failed before its head: {exc!r}"))
            elif not self._ended:
                self._chunks.put_nowait(httpx.ReadError(f"app failed mid-body: {exc!r}"))
            return
        if not self._head.done():
            self._head.set_exception(httpx.RemoteProtocolError("app returned without a response"))
        elif not self._ended:
            self._chunks.put_nowait(httpx.RemoteProtocolError("app returned before the body's end"))

    async def head(self) -> None:
        self.status, self.headers = await self._head

    async def iter_body(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self._chunks.get()
            if isinstance(chunk, BaseException):
                raise chunk
            if chunk is _END:
                return
            yield chunk

    async def aclose(self) -> None:
        self._disconnected.set()
        if not self._task.done():
            await asyncio.sleep(0)  # let the app see the disconnect and end by itself
        if not self._task.done():
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class AsgiUpstream:
    """:class:`~burstsched.dispatch.upstream.Upstream` over in-process ASGI apps, by URL authority."""

    def __init__(self, apps: Mapping[str, ASGIApp]) -> None:
        self._apps = dict(apps)

    async def request(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes, timeouts: Timeouts
    ) -> UpstreamResponse:
        parts = urlsplit(url)
        app = self._apps.get(f"{parts.scheme}://{parts.netloc}")
        if app is None:
            raise httpx.ConnectError(f"no in-process app at {parts.scheme}://{parts.netloc}")
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        path = parts.path or "/"
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": method,
            "scheme": parts.scheme,
            "path": path,
            "raw_path": path.encode(),
            "query_string": parts.query.encode(),
            "root_path": "",
            "headers": [(b"host", parts.netloc.encode()), *((k.lower(), v) for k, v in headers)],
            "client": _CLIENT,
            "server": (host, port),
            "state": {},
        }
        if body and not any(k.lower() == b"content-length" for k, _ in headers):
            scope["headers"].append((b"content-length", str(len(body)).encode()))
        exchange = _Exchange(app, scope, body)
        try:
            await exchange.head()
        except BaseException:
            await exchange.aclose()
            raise
        return exchange


@contextlib.asynccontextmanager
async def lifespan(app: ASGIApp) -> AsyncIterator[None]:
    """Start ``app`` (ASGI lifespan startup) for the block, shut it down after; a failed startup raises."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def receive() -> Message:
        return await inbox.get()

    async def send(message: Message) -> None:
        kind = message["type"]
        target = started if kind.startswith("lifespan.startup") else stopped
        if target.done():
            return
        if kind.endswith(".complete"):
            target.set_result(None)
        else:
            target.set_exception(RuntimeError(f"{kind}: {message.get('message', '')}"))

    scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}

    async def run() -> None:
        await app(scope, receive, send)

    task = asyncio.create_task(run())
    inbox.put_nowait({"type": "lifespan.startup"})
    await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
    if not started.done():
        task.result()  # raises what the app raised
        raise RuntimeError("the app ended its lifespan before starting")
    started.result()
    try:
        yield
    finally:
        inbox.put_nowait({"type": "lifespan.shutdown"})
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            await task
        if stopped.done() and stopped.exception() is not None:
            raise stopped.exception()  # type: ignore[misc]
