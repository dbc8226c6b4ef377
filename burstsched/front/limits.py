"""A deadline on reading a request body, as ASGI middleware (slow clients sending their body byte by byte).

The body of a request must arrive whole within ``body_timeout_s`` of the request reaching the app (its
headers complete). Past that, the middleware answers 408 in OpenAI's error shape with ``connection: close``
(the server then drops the connection), and tells the app the client went away (``http.disconnect``); what
the app sends afterwards is dropped. Waiting clients cost one idle coroutine each: they block nobody else.
Slow headers are cut off earlier, in the HTTP protocol (:mod:`burstsched.server.header_guard`).
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from burstsched.wire.errors import error_response


class BodyDeadlineMiddleware:
    """Plain ASGI middleware: 408 when a request's body is not in within ``body_timeout_s``."""

    def __init__(self, app: ASGIApp, body_timeout_s: float) -> None:
        self.app = app
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await _BodyDeadline(scope, receive, send, self.body_timeout_s).run(self.app)


class _BodyDeadline:
    """One request's receive/send, watched."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, timeout_s: float) -> None:
        self._scope = scope
        self._receive = receive
        self._send = send
        self._deadline = asyncio.get_running_loop().time() + timeout_s
        self._body_done = False
        self._response_started = False
        self._timed_out = False

    async def run(self, app: ASGIApp) -> None:
        await app(self._scope, self.receive, self.send)

    async def receive(self) -> Message:
        if self._body_done or self._timed_out:
            return await self._receive()
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            await self._give_up()
            return {"type": "http.disconnect"}
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._body_done = True
        return message

    async def send(self, message: Message) -> None:
        if self._timed_out:
            return  # the client already got its 408
        if message["type"] == "http.response.start":
            self._response_started = True
        await self._send(message)

    async def _give_up(self) -> None:
        self._timed_out = True
        if self._response_started:
            return  # the app answered without waiting for the body; the server closes the connection
        response = error_response(
            408,
            "the request body did not arrive in time",
            code="request_timeout",
            headers={"connection": "close"},
        )
        await response(self._scope, _no_receive, self._send)


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}
