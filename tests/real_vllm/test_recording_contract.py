"""A recording router writes the usage its client read, on the simulator and on real vLLM.

The router (uvicorn on 127.0.0.1, ``recording:`` on) fronts the backend; streamed chat and completions with
``include_usage`` (dozens of SSE reads each, as the replica's server writes them) and a JSON chat response go
through it. Each line's token counts must be those of the ``usage`` the client received, in the replica's own
serialization (vLLM's field order, ``prompt_tokens_details``). Here both backends' usage event reached the
router in the stream's last read, with ``[DONE]``; streams cut into other reads are in
``tests/recording/test_streamed_lines.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from burstsched.config import EndpointConfig, PoolConfig, RecordingConfig, RouterConfig
from burstsched.server.serve import running_router
from burstsched.testing.backends import Backend
from burstsched.wire.sse import SSEReader
from burstsched.workloads.contexts import context_text

pytestmark = pytest.mark.anyio

MAX_TOKENS = 48
"""Tokens per response: a stream of about 50 events."""


def _bodies(backend: Backend) -> dict[str, tuple[str, dict[str, Any]]]:
    """Request id → (path, body)."""
    common = {"model": backend.model, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    report = context_text("recording-contract", 40, 0)  # several KV blocks: the second ask hits the cache
    question = [{"role": "user", "content": f"{report}\nWhich host looks worst, and why?"}]
    return {
        "chat-stream": ("/v1/chat/completions", {**common, **usage, "messages": question}),
        "chat-stream-again": ("/v1/chat/completions", {**common, **usage, "messages": question}),
        "completions-stream": ("/v1/completions", {**common, **usage, "prompt": "Observation 7: the queue"}),
        "chat-json": ("/v1/chat/completions", {**common, "messages": question}),
    }


async def _usage_read(client: httpx.AsyncClient, rid: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The ``usage`` of the response the client received (a stream: its last event that has one)."""
    with anyio.fail_after(120):
        response = await client.post(path, json=body, headers={"x-request-id": rid})
    assert response.status_code == 200, response.text
    if not body.get("stream"):
        usage: dict[str, Any] = response.json()["usage"]
        return usage
    events = SSEReader().feed(response.content)
    assert events[-1] == "[DONE]"
    usages: list[dict[str, Any]] = [u for data in events[:-1] if (u := json.loads(data).get("usage"))]
    assert len(events) > MAX_TOKENS // 2 and usages
    return usages[-1]


async def test_each_line_holds_the_usage_the_client_read(backend: Backend, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    config = RouterConfig(
        endpoints=[EndpointConfig(name="r0", url=backend.url)],
        pool=PoolConfig(health_check_interval_ms=200),
        recording=RecordingConfig(enabled=True, path=str(trace), flush_interval_ms=20),
    )
    read: dict[str, dict[str, Any]] = {}
    async with running_router(config) as router, httpx.AsyncClient(base_url=router.url) as client:
        for rid, (path, body) in _bodies(backend).items():
            read[rid] = await _usage_read(client, rid, path, body)
    # the router has stopped: its recorder wrote what it held
    lines = [json.loads(raw) for raw in trace.read_text().splitlines()]
    by_id = {line["id"]: line for line in lines if line.get("kind") is None}
    assert sorted(by_id) == sorted(read)
    for rid, usage in read.items():
        line = by_id[rid]
        assert line["outcome"] == "ok" and line["endpoint"] == "r0", rid
        assert line["stream"] is _bodies(backend)[rid][1].get("stream", False), rid
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        recorded = (line["input_tokens"], line["output_tokens"], line["cached_tokens"])
        assert recorded == (usage["prompt_tokens"], usage["completion_tokens"], cached), rid
        assert line["output_tokens"] == MAX_TOKENS, rid
    assert by_id["chat-stream-again"]["cached_tokens"] > 0  # the same prompt again: served from the cache
