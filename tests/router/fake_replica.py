"""A small fake vLLM replica for router tests: scriptable failures and a gate between stream chunks."""

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
class FakeReplica:
    """One replica; the test flips its fields to change its behaviour."""

    name: str
    url: str = ""
    healthy: bool = True
    metrics_ok: bool = True
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    block_size: int = 16
    num_gpu_blocks: int = 1365
    fail_status: int | None = None
    chunks: int = 3
    die_after_chunks: int | None = None
    gate: anyio.Event | None = None
    """When set, the stream waits for this event after its first chunk."""
    received: list[dict[str, Any]] = field(default_factory=list)
    headers_seen: list[dict[str, str]] = field(default_factory=list)
    cancelled: int = 0
    """Streams whose client (the router) went away before the end."""

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
        return JSONResponse(
            {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "vllm"}]}
        )

    async def _metrics(self, request: Request) -> Response:
        if not self.metrics_ok:
            return PlainTextResponse("broken", status_code=500)
        labels = f'engine="0",model_name="{MODEL}"'
        text = (
            "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{labels}}} {self.running}\n"
            "# HELP vllm:num_requests_waiting Waiting.\n# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{labels}}} {self.waiting}\n"
            "# HELP vllm:kv_cache_usage_perc KV usage.\n# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{labels}}} {self.kv_usage}\n"
            "# HELP vllm:cache_config_info Cache config.\n# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{self.block_size}",engine="0",'
            f'num_gpu_blocks="{self.num_gpu_blocks}"}} 1.0\n'
            "# HELP vllm:prompt_tokens_total Prompt tokens.\n# TYPE vllm:prompt_tokens_total counter\n"
            f"vllm:prompt_tokens_total{{{labels}}} 12.0\n"
        )
        return PlainTextResponse(text)

    async def _completion(self, request: Request) -> Response:
        body = await request.json()
        self.received.append(body)
        self.headers_seen.append(dict(request.headers))
        if self.fail_status is not None:
            error = {"error": {"message": "injected", "type": "server_error", "param": None, "code": None}}
            return JSONResponse(error, status_code=self.fail_status)
        chat = request.url.path.endswith("chat/completions")
        if not body.get("stream"):
            text = "".join(f"tok{i} " for i in range(self.chunks))
            choice = (
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
                    "usage": {
                        "prompt_tokens": 5,
                        "completion_tokens": self.chunks,
                        "total_tokens": 5 + self.chunks,
                    },
                    "served_by": self.name,
                }
            )
        return StreamingResponse(self._events(chat), media_type="text/event-stream")

    async def _events(self, chat: bool) -> AsyncIterator[bytes]:
        try:
            for i in range(self.chunks):
                if self.die_after_chunks is not None and i >= self.die_after_chunks:
                    raise ConnectionAbortedError("fake replica dies mid-stream")
                delta = {"delta": {"content": f"tok{i} "}} if chat else {"text": f"tok{i} "}
                chunk = {
                    "id": "cmpl-fake",
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "model": MODEL,
                    "choices": [{"index": 0, **delta, "finish_reason": None}],
                }
                yield f"data: {json.dumps(chunk)}\n\n".encode()
                if i == 0 and self.gate is not None:
                    await self.gate.wait()
            yield b"data: [DONE]\n\n"
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise


@asynccontextmanager
async def fake_replicas(count: int) -> AsyncIterator[list[FakeReplica]]:
    """``count`` fake replicas, each on its own uvicorn server on 127.0.0.1."""
    replicas = [FakeReplica(f"fake-{i}") for i in range(count)]
    async with AsyncExitStack() as stack:
        for replica in replicas:
            replica.url = await stack.enter_async_context(serving(replica.app()))
        yield replicas
