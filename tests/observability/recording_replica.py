"""A small OpenAI-compatible replica that records the headers it is sent (to see what the router injects)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from burstsched.server.serve import serving

MODEL = "kv-demo"


@dataclass
class FailureBudget:
    """Chat requests to answer with HTTP 503 before answering normally, shared by the replicas given it."""

    remaining: int = 0


@dataclass
class RecordingReplica:
    name: str
    failures: FailureBudget = field(default_factory=FailureBudget)
    url: str = ""
    headers_seen: list[dict[str, str]] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self._health),
                Route("/v1/models", self._models),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
            ]
        )

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def _models(self, request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "test"}]}
        )

    async def _chat(self, request: Request) -> Response:
        self.headers_seen.append(dict(request.headers))
        body = await request.json()
        if self.failures.remaining > 0:
            self.failures.remaining -= 1
            return JSONResponse({"error": {"message": "injected", "type": "server_error"}}, status_code=503)
        return StreamingResponse(
            self._events(bool(body.get("stream_options"))), media_type="text/event-stream"
        )

    async def _events(self, usage: bool) -> AsyncIterator[bytes]:
        for i, reason in enumerate((None, "length")):
            choice = {"delta": {"content": f"t{i}"}, "finish_reason": reason}
            chunk = {"id": "chatcmpl-rec", "model": MODEL, "choices": [choice]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        if usage:
            counts = {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}
            yield f"data: {json.dumps({'id': 'chatcmpl-rec', 'choices': [], 'usage': counts})}\n\n".encode()
        yield b"data: [DONE]\n\n"


@asynccontextmanager
async def recording_replica(
    name: str, failures: FailureBudget | None = None
) -> AsyncIterator[RecordingReplica]:
    replica = RecordingReplica(name, failures or FailureBudget())
    async with serving(replica.app()) as url:
        replica.url = url
        yield replica
