"""Refuse new requests while the router drains on shutdown (the app's outermost middleware)."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from burstsched.dispatch.drain import Drainer
from burstsched.wire.errors import error_response


class RefuseWhileDraining:
    """ASGI middleware: once the app's drainer is draining, new HTTP requests get 503 (connection closed)."""

    def __init__(self, app: ASGIApp, drainer: Drainer) -> None:
        self.app = app
        self.drainer = drainer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.drainer.draining:
            response = error_response(503, "the router is shutting down", headers={"connection": "close"})
            await response(scope, receive, send)
            return
        self.drainer.request_started()
        try:
            await self.app(scope, receive, send)
        finally:
            self.drainer.request_finished()
