"""A streaming chat request timed the way the workloads report it.

TTFT is client side: from sending the request to the first chunk that carries a choice. vLLM sends that
chunk (the assistant's role, empty content) when the engine returns the request's first token, and vLLM's
own serving benchmark times TTFT the same way. The first non-empty ``delta.content`` is kept apart
(``first_content_s``): it comes later whenever the first tokens decode to no text (special tokens, an
incomplete UTF-8 sequence, text held back until the detokenizer can tell it is whole). On real vLLM with
the workloads' prompts the two differ by more than 20 ms for 2-3 requests in 1000.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from burstsched.wire.sse import DONE, aiter_data


@dataclass(slots=True)
class StreamResult:
    """What one streamed chat completion looked like from the client."""

    status: int
    ttft_s: float | None = None
    """First chunk carrying a choice: the first token."""
    first_content_s: float | None = None
    """First chunk carrying non-empty content."""
    e2e_s: float = 0.0
    content: str = ""
    usage: dict[str, Any] | None = None
    endpoint: str | None = None
    error: dict[str, Any] | None = None
    done: bool = False
    chunks: int = 0
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def cached_tokens(self) -> int | None:
        details = (self.usage or {}).get("prompt_tokens_details") or {}
        value = details.get("cached_tokens")
        return int(value) if value is not None else None


def chat_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """The seed protocol's request body: one user message, streamed, greedy, with usage."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream_chat(
    client: httpx.AsyncClient,
    base_url: str,
    body: dict[str, Any],
    request_id: str,
    clock: Callable[[], float] = time.perf_counter,
    extra_headers: Mapping[str, str] | None = None,
) -> StreamResult:
    """Send one streaming chat completion and read it to the end; ``extra_headers`` go with the request
    (a priority or a tenant, say), after the ``X-Request-Id``."""
    start = clock()
    headers = {"X-Request-Id": request_id, **(extra_headers or {})}
    async with client.stream("POST", f"{base_url}/v1/chat/completions", json=body, headers=headers) as resp:
        result = StreamResult(status=resp.status_code, endpoint=resp.headers.get("x-burstsched-endpoint"))
        result.headers = dict(resp.headers)
        if resp.status_code != 200:
            raw = await resp.aread()
            result.error = _error_of(raw)
            result.e2e_s = clock() - start
            return result
        async for data in aiter_data(resp.aiter_bytes()):
            if data == DONE:
                result.done = True
                continue
            chunk = json.loads(data)
            result.chunks += 1
            if "error" in chunk:
                result.error = chunk["error"]
                continue
            if chunk.get("usage"):
                result.usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if result.ttft_s is None:
                    result.ttft_s = clock() - start
                text = (choice.get("delta") or {}).get("content") or ""
                if text and result.first_content_s is None:
                    result.first_content_s = clock() - start
                result.content += text
    result.e2e_s = clock() - start
    return result


def _error_of(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError:
        return {"message": raw[:200].decode(errors="replace")}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {"message": str(body)[:200]}
