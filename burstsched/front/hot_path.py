"""The completions routes on a short path: the app answers them without Starlette's routing and handlers.

Nearly every request a router serves is ``POST /v1/chat/completions`` or ``POST /v1/completions``. Starlette
would walk its error middleware, exception middleware, router and route for each (a few wrappers of
``send`` apiece); :class:`RouterApp` hands those two routes straight to their own middleware chain (refusal
while draining, keys, the body deadline) and an :class:`ErrorGuard`, which together do what Starlette's
layers did for them. Every other request, and the lifespan, go through Starlette as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from burstsched.wire.errors import error_response

log = logging.getLogger(__name__)


class RouterApp(Starlette):
    """Starlette, with ``hot`` routes (POST path → ASGI app) served before its own stack."""

    def __init__(self, *, hot: Mapping[str, ASGIApp], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._hot = dict(hot)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            app = self._hot.get(scope["path"])
            if app is not None:
                scope["app"] = self
                await app(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


class ErrorGuard:
    """Answers an unexpected exception with a 500 in OpenAI's error shape, as Starlette's handler would.

    Once the response has started, the exception goes on to the server, which closes the connection.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception:
            if started:
                raise
            log.exception("unexpected error serving POST %s", scope.get("path"))
            await error_response(500, "internal error in the router")(scope, receive, send)
