"""What a streamed request's line holds, whatever reads its stream arrives in.

A real router (uvicorn) records; its one replica sits behind the upstream seam and hands the router its
stream read by read, as scripted: one read per event, the whole stream at once, reads that cut events
anywhere, the usage event and ``[DONE]`` in reads of a few bytes.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from burstsched.config import EndpointConfig, PoolConfig, RecordingConfig, RouterConfig
from burstsched.dispatch.upstream import Timeouts
from burstsched.server.serve import running_router

MODEL = "m"
TOKENS = 300
"""Content events per stream: about 40 KiB, far more than the 2 KiB a router keeps at most of its end."""
USAGE = {
    "prompt_tokens": 812,
    "total_tokens": 812 + TOKENS,
    "completion_tokens": TOKENS,
    "prompt_tokens_details": {"cached_tokens": 640},
}
FIRST_READ_DELAY_S = 0.04
LAST_READ_DELAY_S = 0.04
DONE = b"data: [DONE]\n\n"
METRICS = (
    '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="m"} 0\n'
    '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 0\n'
)


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _events(*, usage: bool, done: bool = True) -> list[bytes]:
    """A chat stream as OpenAI sends it with ``include_usage``: ``"usage": null`` on every content chunk,
    then a chunk with the usage and no choices, then ``[DONE]``."""
    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL}
    events = [
        _event({**head, "choices": [{"index": 0, "delta": {"content": f" t{i}"}}], "usage": None})
        for i in range(TOKENS)
    ]
    if usage:
        events.append(_event({**head, "choices": [], "usage": USAGE}))
    return events + [DONE] if done else events


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def _tiny_end(events: list[bytes]) -> list[bytes]:
    """One read per content event; the usage event in 7-byte reads, ``[DONE]`` in 1-byte reads."""
    *content, usage, done = events
    return content + _pieces(usage, 7) + _pieces(done, 1)


SPLITS: dict[str, Callable[[list[bytes]], list[bytes]]] = {
    "one read per event": lambda events: events,
    "the whole stream in one read": lambda events: [b"".join(events)],
    "1000-byte reads across events": lambda events: _pieces(b"".join(events), 1000),
    "tiny reads at the end": _tiny_end,
    "random cuts": lambda events: _random_cuts(b"".join(events), random.Random(7)),
    "128-byte reads (the least the router keeps by reference)": lambda events: _pieces(b"".join(events), 128),
    "cuts at the kept reads' bounds": lambda events: _random_cuts(
        b"".join(events), random.Random(8), (1, 127, 128, 2047, 2048, 5000)
    ),
    "a long read, then 1-byte reads": lambda events: _long_then_bytes(b"".join(events), 700),
    "long reads, each followed by 1-byte reads": lambda events: _long_then_bytes(b"".join(events), 12),
}


def _long_then_bytes(data: bytes, short: int) -> list[bytes]:
    """Reads of 2.5 KiB, each followed by ``short`` 1-byte reads; the stream's last 700 bytes in 1-byte
    reads (the router joins reads under 128 bytes to the read before them, keeping 2 KiB at most)."""
    head, end = data[:-700], data[-700:]
    reads: list[bytes] = []
    at = 0
    while at < len(head):
        reads.append(head[at : at + 2500])
        at += 2500
        reads += _pieces(head[at : at + short], 1)
        at += short
    return reads + _pieces(end, 1)


def _random_cuts(
    data: bytes, rng: random.Random, sizes: tuple[int, ...] = (1, 3, 40, 300, 2500)
) -> list[bytes]:
    reads, at = [], 0
    while at < len(data):
        size = rng.choice(sizes)
        reads.append(data[at : at + size])
        at += size
    return reads


class _Response:
    def __init__(self, status: int, body: bytes, reads: list[bytes] | None = None) -> None:
        self.status = status
        self.headers = [(b"content-type", b"text/event-stream" if reads is not None else b"text/plain")]
        self._reads = reads if reads is not None else [body]

    async def iter_body(self) -> AsyncIterator[bytes]:
        last = len(self._reads) - 1
        for index, read in enumerate(self._reads):
            if index == 0 and self.headers[0][1] == b"text/event-stream":
                await asyncio.sleep(FIRST_READ_DELAY_S)
            if index == last and index > 0:
                await asyncio.sleep(LAST_READ_DELAY_S)
            yield read

    async def aclose(self) -> None:
        return None


class ScriptedReplica:
    """An upstream whose completions stream comes in the reads its request's prompt names."""

    def __init__(self, scripts: dict[str, list[bytes]]) -> None:
        self.scripts = scripts

    async def request(
        self, method: str, url: str, headers: list[tuple[bytes, bytes]], body: bytes, timeouts: Timeouts
    ) -> _Response:
        path = "/" + url.split("://", 1)[1].split("/", 1)[1]
        if path == "/health":
            return _Response(200, b"")
        if path == "/metrics":
            return _Response(200, METRICS.encode())
        if path == "/v1/models":
            return _Response(200, json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode())
        prompt = json.loads(body)["messages"][0]["content"]
        return _Response(200, b"", self.scripts[prompt])


async def _serve(scripts: dict[str, list[bytes]], trace: Path, *, recording: bool = True) -> dict[str, bytes]:
    """Each script's request through a router (recording to ``trace``); what its client received."""
    config = RouterConfig(
        endpoints=[EndpointConfig(name="r1", url="http://r1:8000")],
        pool=PoolConfig(scrape_interval_ms=20, staleness_threshold_ms=2000, health_check_interval_ms=100),
        recording=RecordingConfig(enabled=recording, path=str(trace), flush_interval_ms=20),
    )
    received: dict[str, bytes] = {}
    async with (
        running_router(config, upstream=ScriptedReplica(scripts)) as router,
        httpx.AsyncClient(base_url=router.url, timeout=10) as client,
    ):
        for name in scripts:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": name}],
                "stream": True,
                "stream_options": {"include_usage": True},
                "max_tokens": TOKENS,
            }
            headers = {"x-request-id": name}
            with anyio.fail_after(10):
                response = await client.post("/v1/chat/completions", json=body, headers=headers)
            assert response.status_code == 200, name
            received[name] = response.content
    return received


def _lines(trace: Path) -> dict[str, dict[str, Any]]:
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    return {line["id"]: line for line in lines}


@pytest.mark.anyio
async def test_a_streamed_line_holds_its_usage_and_ttft_however_the_stream_was_read(tmp_path: Path) -> None:
    events = _events(usage=True)
    scripts = {name: split(events) for name, split in SPLITS.items()}
    assert all(b"".join(reads) == b"".join(events) for reads in scripts.values())
    received = await _serve(scripts, tmp_path / "trace.jsonl")
    lines = _lines(tmp_path / "trace.jsonl")
    assert sorted(lines) == sorted(scripts)
    for name, line in lines.items():
        assert received[name] == b"".join(events), name  # passed through whole, no error event added
        assert line["stream"] is True and line["outcome"] == "ok" and line["endpoint"] == "r1", name
        counts = (line["input_tokens"], line["output_tokens"], line["cached_tokens"])
        assert counts == (812, TOKENS, 640), name
        assert line["max_tokens"] == TOKENS
        # TTFT ends at the first read; the stream goes on until the last one
        assert line["ttft_ms"] >= FIRST_READ_DELAY_S * 1000 * 0.9, name
        if len(scripts[name]) > 1:
            assert line["e2e_ms"] - line["ttft_ms"] >= LAST_READ_DELAY_S * 1000 * 0.9, name


@pytest.mark.anyio
async def test_a_stream_without_usage_or_cut_short_records_no_counts(tmp_path: Path) -> None:
    no_usage = _events(usage=False)
    cut = _events(usage=True, done=False)
    scripts = {"no usage": _pieces(b"".join(no_usage), 700), "cut short": _pieces(b"".join(cut), 700)}
    received = await _serve(scripts, tmp_path / "trace.jsonl")
    lines = _lines(tmp_path / "trace.jsonl")
    assert received["no usage"] == b"".join(no_usage)
    assert lines["no usage"]["outcome"] == "ok"
    assert (lines["no usage"]["input_tokens"], lines["no usage"]["output_tokens"]) == (None, None)
    # a stream that ends without [DONE] gets an error event, and its line says so
    assert received["cut short"].startswith(b"".join(cut))
    assert b'"error"' in received["cut short"][len(b"".join(cut)) :]
    assert received["cut short"].endswith(DONE)
    assert lines["cut short"]["outcome"] == "stream_error"
    assert lines["cut short"]["ttft_ms"] is not None


@pytest.mark.anyio
@pytest.mark.parametrize("recording", [False, True])
async def test_a_stream_is_whole_exactly_when_it_ends_in_done(tmp_path: Path, recording: bool) -> None:
    """The end check sees the stream's last bytes however small its last reads were (the router keeps them
    differently when it records)."""
    whole, cut = _events(usage=True), _events(usage=True, done=False)
    scripts = {
        "whole, tiny reads at the end": _tiny_end(whole),
        "cut, tiny reads at the end": _tiny_end(cut[:-1] + [cut[-1], b"\n"]),
        "whole, one read": [b"".join(whole)],
    }
    received = await _serve(scripts, tmp_path / "trace.jsonl", recording=recording)
    assert received["whole, tiny reads at the end"] == b"".join(whole)
    assert received["whole, one read"] == b"".join(whole)
    assert received["cut, tiny reads at the end"].startswith(b"".join(cut) + b"\n")
    assert b'"error"' in received["cut, tiny reads at the end"][len(b"".join(cut)) :]
    assert (tmp_path / "trace.jsonl").exists() is recording
