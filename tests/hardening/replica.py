"""A scriptable fake vLLM replica for the hardening tests: failures before and after the first byte, stalls,
a gate between chunks, and counts of running and cancelled streams."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from burstsched.server.serve import serving

MODEL = "fake-model"


@dataclass
class Replica:
    """One fake replica; tests flip its fields."""

    name: str
    url: str = ""
    healthy: bool = True
    fail_status: int | None = None
    stall_head_s: float = 0.0
    """Sleep this long before answering anything (a replica stalling before its first byte)."""
    die_before_first_chunk: bool = False
    """Send a 200 stream's headers, then break the connection before any chunk."""
    die_after_chunks: int | None = None
    chunks: int = 3
    gate: anyio.Event | None = None
    """When set, a stream waits for it after its first chunk."""
    received: list[dict[str, Any]] = field(default_factory=list)
    headers_seen: list[dict[str, str]] = field(default_factory=list)
    paths_seen: list[str] = field(default_factory=list)
    running: int = 0
    cancelled: int = 0

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self._health),
                Route("/metrics", self._metrics),
                Route("/v1/models", self._models),
                Route("/v1/chat/completions", self._completion, methods=["POST"]),
                Route("/v1/completions", self._completion, methods=["POST"]),
            ]
        )

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200 if self.healthy else 503)

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _metrics(self, request: Request) -> Response:
        labels = f'model_name="{MODEL}"'
        return PlainTextResponse(
            f"vllm:num_requests_running{{{labels}}} {self.running}\n"
            f"vllm:num_requests_waiting{{{labels}}} 0\n"
            f"vllm:kv_cache_usage_perc{{{labels}}} 0.0\n"
        )

    async def _completion(self, request: Request) -> Response:
        body = await request.json()
        self.received.append(body)
        self.headers_seen.append(dict(request.headers))
        self.paths_seen.append(request.url.path)
        if self.stall_head_s:
            await anyio.sleep(self.stall_head_s)
        if self.fail_status is not None:
            error = {"error": {"message": "injected", "type": "server_error", "param": None, "code": None}}
            return JSONResponse(error, status_code=self.fail_status)
        chat = request.url.path.endswith("chat/completions")
        if not body.get("stream"):
            text = "".join(f"tok{i} " for i in range(self.chunks))
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}}
                if chat
                else {"index": 0, "text": text}
            )
            return JSONResponse(
                {
                    "id": "cmpl-fake",
                    "object": "chat.completion" if chat else "text_completion",
                    "model": MODEL,
                    "choices": [{**choice, "finish_reason": "length"}],
                    "served_by": self.name,
                }
            )
        return StreamingResponse(self._events(chat), media_type="text/event-stream")

    async def _events(self, chat: bool) -> AsyncIterator[bytes]:
        self.running += 1
        try:
            if self.die_before_first_chunk:
                raise ConnectionAbortedError("fake replica dies before its first chunk")
            for i in range(self.chunks):
                if self.die_after_chunks is not None and i >= self.die_after_chunks:
                    raise ConnectionAbortedError("fake replica dies mid-stream")
                last = i == self.chunks - 1
                delta = {"delta": {"content": f"tok{i} "}} if chat else {"text": f"tok{i} "}
                chunk = {
                    "id": "cmpl-fake",
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "model": MODEL,
                    "choices": [{"index": 0, **delta, "finish_reason": "length" if last else None}],
                }
                yield f"data: {json.dumps(chunk)}\n\n".encode()
                if i == 0 and self.gate is not None:
                    await self.gate.wait()
            yield b"data: [DONE]\n\n"
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        finally:
            self.running -= 1


@asynccontextmanager
async def replicas(count: int) -> AsyncIterator[list[Replica]]:
    """``count`` fake replicas named ``r0``, ``r1``…, each on its own uvicorn server on 127.0.0.1."""
    reps = [Replica(f"r{i}") for i in range(count)]
    async with AsyncExitStack() as stack:
        for rep in reps:
            rep.url = await stack.enter_async_context(serving(rep.app()))
        yield reps


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [block[len("data: ") :] for block in text.split("\n\n") if block.startswith("data: ")]
