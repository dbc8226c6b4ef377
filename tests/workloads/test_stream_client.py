"""The workloads' stream client times TTFT at the first token, not at the first text."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from burstsched.workloads.stream_client import chat_body, stream_chat


def sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def delta(**fields: str) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": fields, "finish_reason": None}],
    }


def ticks() -> Callable[[], float]:
    """A clock that advances one second per reading: each reading's value says when it was taken."""
    counter: Iterator[int] = iter(range(1000))
    return lambda: float(next(counter))


def client_for(body: bytes) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer))


@pytest.mark.anyio
async def test_ttft_is_the_first_chunk_with_a_choice_even_when_its_text_is_empty() -> None:
    # vLLM's shape: the role chunk comes with the first token; here the first tokens decode to no text.
    usage = {"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 5}}
    body = sse([delta(role="assistant", content=""), delta(content=""), delta(content="hi"), usage])
    async with client_for(body) as client:
        result = await stream_chat(client, "http://replica", chat_body("m", "p", 3), "r1", ticks())
    # Readings: 0 at sending, 1 at the role chunk (the first token), 2 at "hi", 3 at the end.
    assert result.ttft_s == 1.0
    assert result.first_content_s == 2.0
    assert result.e2e_s == 3.0
    assert result.content == "hi"
    assert result.usage == {"prompt_tokens": 5}
    assert result.done


@pytest.mark.anyio
async def test_a_stream_without_any_choice_has_no_ttft() -> None:
    usage = {"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 5}}
    async with client_for(sse([usage])) as client:
        result = await stream_chat(client, "http://replica", chat_body("m", "p", 3), "r2", ticks())
    assert result.ttft_s is None
    assert result.first_content_s is None
    assert result.usage == {"prompt_tokens": 5}
