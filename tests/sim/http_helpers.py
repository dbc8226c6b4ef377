"""HTTP helpers for tests against simulated replicas."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

from burstsched.wire.sse import DONE, data_payloads

MODEL = "kv-demo"


@asynccontextmanager
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as http:
        yield http


def chat_body(text: str, *, max_tokens: int = 8, stream: bool = False, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    body.update(extra)
    return body


async def chat(http: httpx.AsyncClient, url: str, text: str, *, max_tokens: int = 8) -> dict[str, Any]:
    """A non-streaming chat completion; returns the JSON body."""
    response = await http.post(f"{url}/v1/chat/completions", json=chat_body(text, max_tokens=max_tokens))
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


async def stream_events(
    http: httpx.AsyncClient, url: str, path: str, body: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON chunks of an SSE stream and its raw non-blank lines (each checked to be a ``data: `` line,
    as vLLM writes every event)."""
    async with http.stream("POST", f"{url}{path}", json=body) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = await response.aread()
    lines = [line for line in raw.decode().split("\n") if line]
    assert all(line.startswith("data: ") for line in lines), lines
    events = data_payloads(raw)
    assert len(events) == len(lines)  # one line per event, each ended by a blank line
    chunks = [json.loads(data) for data in events if data != DONE]
    return chunks, lines


async def metrics(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    """Every sample of ``/metrics`` keyed by name and sorted labels (engine and model labels dropped)."""
    response = await http.get(f"{url}/metrics")
    response.raise_for_status()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k not in ("engine", "model_name")}
            key = sample.name + "".join(f"[{k}={v}]" for k, v in sorted(labels.items()))
            out[key] = sample.value
    return out


async def metrics_when(
    http: httpx.AsyncClient, url: str, predicate: Callable[[dict[str, float]], bool], limit_s: float = 10.0
) -> dict[str, float]:
    """Scrape ``/metrics`` every 20 ms until ``predicate`` holds (bounded)."""
    with anyio.fail_after(limit_s):
        for _ in range(int(limit_s / 0.02) + 1):
            state = await metrics(http, url)
            if predicate(state):
                return state
            await anyio.sleep(0.02)
    raise AssertionError("metrics never satisfied the predicate")
