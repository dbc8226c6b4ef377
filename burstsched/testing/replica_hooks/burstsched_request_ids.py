"""An ASGI middleware for a vLLM API server: the ``X-Request-Id`` of every inference request, one per line.

    PYTHONPATH=<this folder> BURSTSCHED_REQUEST_IDS=/path/ids.txt \\
        python -m vllm.entrypoints.openai.api_server --middleware burstsched_request_ids.RecordRequestIds ...

vLLM adds a class given to ``--middleware`` with ``app.add_middleware``. Each ``POST`` whose path ends in
``/completions`` is written as its request id (``-`` without one) before the app sees it; the file is
line-buffered, so a reader sees every request already received. A peer router's answers do not say which
replica served them; these files do (:mod:`burstsched.workloads.placement`). Without the variable the
middleware passes everything through untouched.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import IO, Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

VARIABLE = "BURSTSCHED_REQUEST_IDS"


class RecordRequestIds:
    """Writes each inference request's id to the file named by ``BURSTSCHED_REQUEST_IDS``."""

    def __init__(self, app: App) -> None:
        self.app = app
        path = os.environ.get(VARIABLE)
        self._out: IO[str] | None = open(path, "a", buffering=1, encoding="utf-8") if path else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        out = self._out
        if out is not None and scope.get("type") == "http" and scope.get("method") == "POST":
            if str(scope.get("path", "")).endswith("/completions"):
                rid = next((v for k, v in scope.get("headers", ()) if k == b"x-request-id"), b"-")
                out.write(rid.decode("latin-1").replace("\n", " ") + "\n")
        await self.app(scope, receive, send)

    def close(self) -> None:
        """Close the file (a replica keeps it open for its lifetime; tests close it)."""
        if self._out is not None:
            self._out.close()
            self._out = None


def read_ids(path: str | os.PathLike[str]) -> list[str]:
    """The ids a replica's file holds so far, in arrival order (none when it does not exist yet)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []
