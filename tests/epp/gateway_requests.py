"""Requests the gateway tests send through Envoy and ``burstsched epp``, shared by each Envoy configuration's
tests (llm-d's standalone mode, Envoy AI Gateway's)."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import Mapping

import httpx

from burstsched.wire.sse import data_payloads

MODEL = "kv-demo"


def chat(content: str, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


def words(rng: random.Random, n_bytes: int) -> str:
    """A prompt of at least ``n_bytes`` that no other test's shares a prefix with (its first word is new)."""
    out, size = [f"doc-{uuid.UUID(int=rng.getrandbits(128))}"], 0
    while size < n_bytes:
        out.append(f"observation{rng.randrange(10**9):09d}x{rng.randrange(10**6):06d}")
        size += len(out[-1]) + 1
    return " ".join(out)


async def each_api(client: httpx.AsyncClient, headers: Mapping[str, str] | None = None) -> list[str]:
    """Chat and completions, whole and streamed (12 tokens), each checked whole: its object, a stream's
    content type, its ``[DONE]`` and its ``length`` finish. Returns the endpoint each named
    (``x-burstsched-endpoint``), in that order."""
    served: list[str] = []
    whole = await client.post("/v1/chat/completions", json=chat("Say something."), headers=headers)
    assert whole.status_code == 200, whole.text
    assert whole.json()["object"] == "chat.completion"
    assert whole.json()["choices"][0]["message"]["content"]
    served.append(whole.headers["x-burstsched-endpoint"])
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 3}
    completion = await client.post("/v1/completions", json=body, headers=headers)
    assert completion.status_code == 200, completion.text
    assert completion.json()["object"] == "text_completion"
    served.append(completion.headers["x-burstsched-endpoint"])
    for path, streamed in (
        ("/v1/chat/completions", chat("Stream it.", max_tokens=12, stream=True)),
        ("/v1/completions", {"model": MODEL, "prompt": "Go", "max_tokens": 12, "stream": True}),
    ):
        async with client.stream("POST", path, json=streamed, headers=headers) as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            raw = await stream.aread()
            served.append(stream.headers["x-burstsched-endpoint"])
        events = data_payloads(raw)
        assert events[-1] == "[DONE]"
        choices = [json.loads(e)["choices"][0] for e in events[:-1]]
        assert choices[-1]["finish_reason"] == "length"
        assert len(choices) >= 12  # 12 tokens (a chat stream opens with its role)
    return served


async def burst_landings(client: httpx.AsyncClient, rng: random.Random, bursts: int = 4) -> list[set[str]]:
    """``bursts`` bursts of 8 chat requests, each burst sharing a new 6 KB context sent at once; the
    endpoints each burst was served by (``x-burstsched-endpoint``)."""
    landed: list[set[str]] = []
    for _ in range(bursts):
        context = words(rng, 6_000)

        async def one(i: int, context: str = context) -> str:
            response = await client.post("/v1/chat/completions", json=chat(f"{context}\nQuestion {i}?"))
            assert response.status_code == 200, response.text
            return response.headers["x-burstsched-endpoint"]

        landed.append(set(await asyncio.gather(*(one(i) for i in range(8)))))
    return landed
